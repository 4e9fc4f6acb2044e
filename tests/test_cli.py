"""The command line end to end on tiny models: records, plugins, sweeps, and one-line errors."""
import argparse
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sbd_bench.cli import ProgressBar, build_parser, main
from sbd_bench.types import SAMPLE_FIELDS, SUMMARY_ROW_FIELDS

ROOT = Path(__file__).resolve().parent.parent
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
    # the fixed_k family's AUP: NTP's point and both of its own, the same on each of its rows
    [fixed_k] = [e for e in summary["yardsticks"]["aup"] if e["family"] == "fixed_k"]
    assert [p[0] for p in fixed_k["points"]] == [1.0, 2.0, 4.0] and fixed_k["anchor"] == "ntp"
    assert rows["fixed_k:k=2"]["aup"] == rows["fixed_k:k=4"]["aup"] == fixed_k["aup"]
    assert summary["yardsticks"]["mean_aup"]["fixed_k"] == fixed_k["aup"]  # one task


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


FAILING_PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass
    from typing import ClassVar
    from sbd_bench.types import BlockView, Solver

    @dataclass(frozen=True)
    class AlwaysFails(Solver):
        name: ClassVar[str] = "always_fails"
        description: ClassVar[str] = "test plugin"

        def select(self, view: BlockView):
            raise RuntimeError("planted: this solver fails on every example, and its message is long enough "
                               "to be cut by a sixty-character progress line")
''')


def test_failed_samples_exit_1_and_are_listed_at_the_end(tiny_models, tasks_file, tmp_path):
    """A real process (as a user runs it, stderr not a terminal): exit status 1, the first failure of
    the configuration printed in full when it happens, one line per failing configuration at the end."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "always_fails.py").write_text(FAILING_PLUGIN)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "sbd_bench", "run", "--model", str(tiny_models["llama"]), "--task",
                           str(tasks_file), "--plugins", str(plugins), "--solver", "always_fails", "--block-size", "4",
                           "--max-new-tokens", "8", "--no-report", "--no-cost-curve", "--warmup", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    reason = ("RuntimeError: planted: this solver fails on every example, and its message is long enough to be cut "
              "by a sixty-character progress line")
    assert proc.returncode == 1, proc.stderr[-3000:]
    err = proc.stderr.splitlines()
    where = f" (at {plugins / 'always_fails.py'}:12; SBD_BENCH_TRACEBACK=1 prints the traceback)"  # the plugin's line
    assert f"failed: always_fails on mini/a: {reason}{where}" in err  # when it happened, in full
    assert err[-1] == f"failed: always_fails: 2 of 2 samples (mini 2): {reason}{where}"  # the end: one line per config
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["failures"] == 2
    assert "[4/4]" in proc.stderr  # the plain progress lines of a log (not a terminal)


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def record(config, id="a", error=None, task="mini"):
    return {"task": task, "id": id, "config": config, "error": error}


def test_progress_bar_on_a_terminal_prints_messages_above_it_uncut():
    stream = FakeTerminal()
    bar = ProgressBar(stream)
    bar.message("models/x on cpu, 1 thread(s)")
    bar.start(total=4, done=1)
    long_config = "entropy_bounded:gamma=0.35,proxy=entropy+a_label_longer_than_sixty_characters_in_all"
    bar.update(record(long_config, error="RuntimeError: " + "x" * 100))
    bar.update(record(long_config, id="b", error="RuntimeError: again"))  # the same configuration: once only
    bar.update(record("ntp", id="c"))
    bar.close()
    text = stream.getvalue()
    assert f"failed: {long_config} on mini/a: RuntimeError: {'x' * 100}\n" in text
    assert "again" not in text
    assert "4/4" in text and "decoding" in text and "\r" in text  # a tqdm bar, redrawn in place


def test_progress_bar_is_drawn_on_a_terminal_that_reports_no_size(monkeypatch):
    """A fresh pseudo-terminal reports 0 x 0: tqdm then computes -1 rows and drew nothing at all."""
    master, slave = os.openpty()
    terminal = os.fdopen(slave, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stderr", terminal)  # tqdm measures only the real stderr/stdout
    bar = ProgressBar()
    bar.start(total=2, done=0)
    bar.update(record("ntp", id="a"))
    bar.update(record("ntp", id="b"))
    bar.close()
    terminal.flush()
    # Linux hands pty output to the master side from a work queue: one read right after the write may
    # see part of it on a loaded machine, so read until everything expected is there or 10 s pass
    import select

    drawn, deadline = "", time.monotonic() + 10
    while not all(s in drawn for s in ("decoding", "2/2", "mini/b ntp")) and time.monotonic() < deadline:
        if select.select([master], [], [], 0.2)[0]:
            drawn += os.read(master, 65536).decode("utf-8", "replace")
    terminal.close()
    os.close(master)
    assert "decoding" in drawn and "2/2" in drawn and "mini/b ntp" in drawn, drawn


def test_progress_in_a_log_is_sparse_and_uncut():
    stream = io.StringIO()
    bar = ProgressBar(stream)
    bar.start(total=100, done=0)
    for i in range(100):
        bar.update(record(f"config_{i}_" + "y" * 70, id=str(i)))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 21 and "\r" not in stream.getvalue()  # the first, every 5%, no carriage returns
    assert lines[-1].startswith("[100/100]") and lines[-1].endswith(f"mini/99 config_99_{'y' * 70}")


def test_threads_default_to_one_for_a_small_model_and_are_recorded(tiny_models, tasks_file, tmp_path, capsys):
    common = ["run", "--model", str(tiny_models["llama"]), "--task", str(tasks_file), "--solver", "ntp",
              "--block-size", "4", "--max-new-tokens", "4", "--no-report", "--no-cost-curve"]
    for extra, threads, chosen in (([], 1, "auto: 1 for a model of"), (["--threads", "2"], 2, "--threads 2")):
        out = tmp_path / f"run{threads}"
        assert main([*common, *extra, "--out", str(out)]) == 0
        provenance = json.loads((out / "summary.json").read_text())["provenance"]
        assert provenance["threads"] == threads and provenance["threads_chosen"].startswith(chosen)
    assert "1 thread(s) (auto: 1 for a model of" in capsys.readouterr().err


def test_threads_rule_for_larger_models_and_gpus(monkeypatch):
    import torch

    from sbd_bench.runner.harness import choose_threads

    def lm(parameters, device="cpu"):
        weights = [SimpleNamespace(numel=lambda: parameters)]
        return SimpleNamespace(device=torch.device(device), model=SimpleNamespace(parameters=lambda: weights))

    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "getloadavg", lambda: (5.4, 0.0, 0.0))
    assert choose_threads(None, lm(99_999_999))[0] == 1
    assert choose_threads(None, lm(100_000_000)) == (11, "auto: 11 of 16 cores (load average 5.4); set --threads "
                                                          "to override")
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 0.0, 0.0))
    assert choose_threads(None, lm(8_000_000_000))[0] == 1  # a saturated machine: still one
    assert choose_threads(3, lm(10)) == (3, "--threads 3")
    assert choose_threads(None, lm(10, "meta"))[0] == 16  # not on the CPU: torch's default


def test_every_option_has_help_and_shows_its_default():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) >= {"run", "list", "train", "report", "compare", "roofline", "throughput"}
    for name, command in commands.items():
        text = "".join(command.format_help().split())  # help wraps lines, at hyphens too
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings[0]} has no help"
                if not (action.default is None or action.default is False or action.default == []):  # 0 shown too
                    assert f"(default:{action.default})".replace(" ", "") in text or "default" in action.help, \
                        f"{name} {action.option_strings[0]}: default {action.default!r} not shown"
    proc = subprocess.run([sys.executable, "-m", "sbd_bench", "train", "--help"], capture_output=True, text=True)
    help_text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "--steps STEPS optimizer steps (the cosine schedule ends here) (default: 2000)" \
        in help_text and "hidden 192" in help_text


def test_train_defaults_build_the_shipped_model():
    """Plain `train` is sbd-tiny's first stage: its architecture (config.json) and the recipe of stage 1 in
    training_stages.jsonl (the later stages fine-tune it with their own flags, all recorded there)."""
    shipped = ROOT / "models" / "sbd-tiny"
    config = json.loads((shipped / "config.json").read_text())
    first = json.loads((shipped / "training_stages.jsonl").read_text().splitlines()[0])
    args = json.loads((shipped / "training_args.json").read_text())
    defaults = vars(build_parser().parse_args(["train"]))
    assert (defaults["hidden_size"], defaults["layers"], defaults["heads"], defaults["intermediate_size"],
            defaults["max_positions"]) == (config["hidden_size"], config["num_hidden_layers"],
                                           config["num_attention_heads"], config["intermediate_size"],
                                           config["max_position_embeddings"])
    for key in ("lr", "batch_size", "warmup", "data", "objective", "train_examples"):
        assert defaults[key] == first[key], key
    assert first["stage"] == 1 and first["base"] is None and not first["resume"]
    for key in ("block_size", "min_block_size", "seed"):  # never changed between stages
        assert defaults[key] == args[key], key


def test_throughput_writes_under_runs_by_default(tiny_models, tasks_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["throughput", "--model", str(tiny_models["llama"]), "--task", str(tasks_file), "--solver", "fixed_k",
                 "--batch-sizes", "1", "--limit", "1", "--block-size", "4", "--max-new-tokens", "4",
                 "--device", "cpu"]) == 0
    written = list((tmp_path / "runs").glob("throughput-*.json"))
    assert len(written) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["mini.jsonl", "runs"]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["out"] == str(written[0].relative_to(tmp_path))
    result = json.loads(written[0].read_text())
    assert result["threads"] == 1 and result["threads_chosen"].startswith("auto: 1 for a model of")


def test_batch_size_rule():
    """--batch-size wins; unset, a small float32 model on the CPU (outputs are batch 1's there) is batched,
    anything else (a GPU, bf16, --exact, a large model) decodes one sequence at a time."""
    import torch

    from sbd_bench.runner.harness import AUTO_BATCH_SIZE, choose_batch_size

    def lm(parameters=1_000_000, device="cpu", dtype=torch.float32, exact=False):
        weights = [SimpleNamespace(numel=lambda: parameters)]
        return SimpleNamespace(device=torch.device(device), dtype=dtype, exact=exact,
                               model=SimpleNamespace(parameters=lambda: weights))

    assert AUTO_BATCH_SIZE > 1
    assert choose_batch_size(None, lm())[0] == AUTO_BATCH_SIZE
    assert choose_batch_size(3, lm()) == (3, "--batch-size 3")
    assert choose_batch_size(1, lm()) == (1, "--batch-size 1")
    for other in (lm(device="meta"), lm(dtype=torch.bfloat16), lm(exact=True), lm(parameters=100_000_000)):
        assert choose_batch_size(None, other)[0] == 1
