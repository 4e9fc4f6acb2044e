"""The command line end to end on tiny models: records, plugins, sweeps, and one-line errors."""
import json
import subprocess
import sys
import textwrap

import pytest

from sbd_bench.cli import main
from sbd_bench.types import SAMPLE_FIELDS, SUMMARY_ROW_FIELDS

PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass
    from typing import ClassVar
    from sbd_bench.types import BlockView, Solver, reveal_top

    @dataclass(frozen=True)
    class RightToLeft(Solver):
        name: ClassVar[str] = "right_to_left"
        description: ClassVar[str] = "test plugin"
        n: int = 3

        def select(self, view: BlockView):
            import torch
            return reveal_top(torch.arange(view.k).float().expand(view.masked.shape), view.masked, self.n)
''')


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "mini.jsonl"
    path.write_text('{"id": "a", "prompt": "1+1=", "answer": "2"}\n{"id": "b", "prompt": "hi", "answer": "x"}\n')
    return path


def test_run_writes_records_and_pairs_against_ntp(tiny_models, tasks_file, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--model", str(tiny_models["llama"]), "--task", str(tasks_file), "--solver",
               "fixed_k:k=2,4", "--block-size", "4", "--max-new-tokens", "12", "--out", str(out)])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # machine-readable last line
    assert last["complete"] and last["rows"] == 3
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and all(set(SAMPLE_FIELDS) <= set(s) for s in samples)
    assert [s["config"] for s in samples[:3]] == ["ntp", "fixed_k:k=2", "fixed_k:k=4"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["complete"]
    for key in ("git_commit", "torch", "transformers", "device", "dtype", "seed", "command", "model_hash"):
        assert key in summary["provenance"]
    rows = {r["config"]: r for r in summary["rows"]}
    assert all(set(SUMMARY_ROW_FIELDS) <= set(r) for r in rows.values())
    assert rows["ntp"]["speed_factor_nfe"] == 1.0 and rows["ntp"]["nfe"] == 12
    assert rows["fixed_k:k=2"]["nfe"] == 6 and rows["fixed_k:k=2"]["speed_factor_nfe"] == 2.0
    assert rows["fixed_k:k=4"]["tokens_per_forward"] == 4.0


def test_plugin_folder_is_found_and_recorded(tiny_models, tasks_file, tmp_path, capsys):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "right_to_left.py").write_text(PLUGIN)
    out = tmp_path / "run"
    rc = main(["run", "--model", str(tiny_models["qwen3"]), "--task", str(tasks_file), "--plugins", str(plugins),
               "--solver", "right_to_left", "--block-size", "6", "--max-new-tokens", "12", "--out", str(out)])
    assert rc == 0
    rows = {r["config"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    assert rows["right_to_left:n=3"]["nfe"] == 4 and rows["right_to_left:n=3"]["solver"] == "right_to_left"
    assert main(["list", "--plugins", str(plugins)]) == 0
    assert "right_to_left" in capsys.readouterr().out


def bad(args, capsys):
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_bad_inputs_are_one_line(tiny_models, tasks_file, tmp_path, capsys):
    model = ["--model", str(tiny_models["llama"])]
    task = ["--task", str(tasks_file)]
    assert "does not exist" in bad(["run", "--model", str(tmp_path / "nope"), *task], capsys)
    assert "no mask token" in bad(["run", "--model", str(tiny_models["nomask"]), *task], capsys)
    assert "did you mean 'entropy_bounded'" in bad(["run", *model, *task, "--solver", "entropy_bonded"], capsys)
    assert "gamma must be >= 0" in bad(["run", *model, *task, "--solver", "entropy_bounded:gamma=-0.1"], capsys)
    assert "tau must be in (0, 1]" in bad(["run", *model, *task, "--solver", "confidence:tau=1.2"], capsys)
    malformed = tmp_path / "bad.jsonl"
    malformed.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": \n')
    assert "bad.jsonl:2" in bad(["run", *model, "--task", str(malformed)], capsys)
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"id": "a", "question": "x"}\n')
    assert "missing field 'prompt'" in bad(["run", *model, "--task", str(missing)], capsys)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "holds no examples" in bad(["run", *model, "--task", str(empty)], capsys)
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"id": "a", "prompt": "x" * 40}) + "\n")
    assert "does not fit the model's context of 32" in bad(["run", "--model", str(tiny_models["short"]),
                                                            "--task", str(long)], capsys)
    assert "unknown task" in bad(["run", *model, "--task", "no_such_task"], capsys)
    assert "--block-size must be >= 1" in bad(["run", *model, *task, "--block-size", "0"], capsys)


def test_errors_exit_cleanly_from_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sbd_bench", "run", "--model", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error: model folder") and len(proc.stderr.strip().splitlines()) == 1
