"""Nothing lost: a run killed by a real signal keeps its finished samples, `run --resume` finishes only
what is missing, and the records then equal those of an uninterrupted run (timings aside); a
configuration that fails is recorded with its error and the sweep goes on."""
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from children import sigint_at_default
from measure_fixtures import make_task_file, make_tiny_model
from sbd_bench.analysis import metrics
from sbd_bench.cli import main
from sbd_bench.runner.harness import RunConfig, resume, run
from sbd_bench.analysis.records import read_records
from sbd_bench.types import UsageError

ROOT = Path(__file__).resolve().parent.parent
MEASURED = {"wall_time_s", "prefill_time_s", "decode_time_s", "peak_memory_bytes", "memory"}

PLUGINS = {
    "slow_plugin.py": '''
import time
from dataclasses import dataclass
from typing import ClassVar
from sbd_bench.types import Solver, reveal_top

@dataclass(frozen=True)
class SlowTopTwo(Solver):
    name: ClassVar[str] = "slow_top_two"
    delay: float = 0.1
    def select(self, view):
        time.sleep(self.delay)  # keeps the run going long enough to be killed mid-way
        return reveal_top(view.confidence, view.masked, 2)
''',
    "term_plugin.py": '''
import os, signal
from dataclasses import dataclass
from typing import ClassVar
from sbd_bench.types import Solver, reveal_top

CALLS = [0]

@dataclass(frozen=True)
class TermOnce(Solver):
    name: ClassVar[str] = "term_once"
    at_call: int = 12
    def select(self, view):
        CALLS[0] += 1
        if CALLS[0] == self.at_call:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal to this very process
        return reveal_top(view.confidence, view.masked, 2)
''',
    "gate_plugin.py": '''
import os, time
from dataclasses import dataclass
from typing import ClassVar
from sbd_bench.types import Solver, reveal_top

@dataclass(frozen=True)
class Gated(Solver):
    name: ClassVar[str] = "gated"
    gate: str = ""
    def select(self, view):
        while self.gate and os.path.exists(self.gate):  # holds the run until the test removes the file
            time.sleep(0.01)
        return reveal_top(view.confidence, view.masked, 2)
''',
    "fail_plugin.py": '''
from dataclasses import dataclass
from typing import ClassVar
import torch
from sbd_bench.types import Solver

@dataclass(frozen=True)
class OutOfMemory(Solver):
    name: ClassVar[str] = "always_oom"
    def select(self, view):
        raise torch.OutOfMemoryError("CUDA out of memory (planted)")
''',
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    plugins = {}
    for name, code in PLUGINS.items():
        (folder / name.removesuffix(".py")).mkdir()
        (folder / name.removesuffix(".py") / name).write_text(code)
        plugins[name.removesuffix("_plugin.py")] = str(folder / name.removesuffix(".py"))
    return {"model": str(make_tiny_model(folder / "model")), "task": str(make_task_file(folder / "t.jsonl", n=6)),
            "plugins": plugins, "folder": folder}


def config(setup, out, solvers, plugin) -> RunConfig:
    return RunConfig(model=setup["model"], tasks=[setup["task"]], solvers=solvers, out=out, block_size=4,
                     max_new_tokens=8, plugins=[setup["plugins"][plugin]], cost_curve=False, report=False, threads=1)


def comparable(records):
    return {metrics.sample_key(r): {k: v for k, v in r.items() if k not in MEASURED} for r in records}


def test_killed_run_resumes_to_the_uninterrupted_records(setup, tmp_path):
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "sbd_bench", "run", "--model", setup["model"], "--task", setup["task"],
           "--solver", "slow_top_two:verify=on+fixed_k:k=2", "--block-size", "4", "--max-new-tokens", "8",
           "--plugins", setup["plugins"]["slow"], "--no-report", "--no-cost-curve", "--threads", "1", "--out", str(killed),
           "--batch-size", "1"]  # batch 1 writes each sample as it ends: the kill falls between samples
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    samples, deadline = killed / "samples.jsonl", time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if samples.exists() and samples.read_text().count("\n") >= 5:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)  # no handler runs: the worst case
    proc.wait(timeout=30)
    before = read_records(samples)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["complete"] is False and 5 <= len(before) < 18

    resume(killed)
    full = run(config(setup, tmp_path / "full", "slow_top_two:verify=on+fixed_k:k=2", "slow"))
    after, expected = read_records(samples), read_records(full / "samples.jsonl")
    assert len(after) == len(expected) == 18  # none lost, none twice
    assert len({metrics.sample_key(r) for r in after}) == 18
    assert comparable(after) == comparable(expected)
    assert comparable(before).items() <= comparable(after).items()  # the finished samples were kept
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["complete"] is True and len(summary["provenance"]["resumed"]) == 1 and "resumed" not in summary
    assert (killed / "run.lock").exists() is False  # the killed run's lock file was taken over, then removed


def test_sigterm_marks_incomplete_and_resume_finishes(setup, tmp_path):
    out = tmp_path / "term"
    cfg = config(setup, out, "term_once", "term")
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    summary = json.loads((out / "summary.json").read_text())
    recorded = read_records(out / "samples.jsonl")
    assert summary["complete"] is False and summary["samples"] == {"planned": 12, "recorded": len(recorded)}
    assert 0 < len(recorded) < 12 and summary["rows"]
    with pytest.raises(UsageError, match="--resume"):
        run(cfg)  # starting afresh in the same folder would lose the records
    summary["resumed"] = [{"command": "an older resumption"}]  # where folders before resumptions moved kept it
    (out / "summary.json").write_text(json.dumps(summary))
    assert main(["run", "--resume", str(out)]) == 0  # through the CLI this time
    summary = json.loads((out / "summary.json").read_text())
    assert "resumed" not in summary  # the documented place (docs/measurement.md): provenance.resumed, the older entry first
    assert [r["command"] for r in summary["provenance"]["resumed"]][0] == "an older resumption"
    assert summary["provenance"]["resumed"][1]["command"].startswith("python -m sbd_bench run --resume")
    records = read_records(out / "samples.jsonl")
    assert len(records) == len({metrics.sample_key(r) for r in records}) == 12
    assert json.loads((out / "summary.json").read_text())["complete"] is True


def test_failing_configuration_is_recorded_and_the_sweep_goes_on(setup, tmp_path):
    out = run(config(setup, tmp_path / "fail", "always_oom+fixed_k:k=2", "fail"))
    records = read_records(out / "samples.jsonl")
    failed = [r for r in records if r["solver"] == "always_oom"]
    assert len(records) == 18 and len(failed) == 6
    assert all(r["error"].startswith("OutOfMemoryError: CUDA out of memory (planted) (at ") for r in failed), failed[0]["error"]
    assert all("fail_plugin.py:11;" in r["error"] for r in failed)  # the plugin's file:line
    assert all(r["error"] is None for r in records if r["solver"] != "always_oom")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and len(summary["failures"]) == 6
    row = next(r for r in summary["rows"] if r["solver"] == "always_oom")
    assert row["errors"] == 6 and row["n"] == 0


def test_resume_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a run folder" in err


def sbd_process(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sbd_bench", *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_at_default)


def test_one_writer_per_folder_and_ctrl_c_prints_the_resume_command(setup, tmp_path):
    """While a run writes a folder, a second `run --out` and a `run --resume` of it are refused in one
    line naming the holder; Ctrl-C then prints the exact resume command, and that command finishes
    the run with every sample once."""
    out, gate = tmp_path / "busy run", tmp_path / "gate"  # a space: the printed command must quote it
    gate.touch()
    args = ["run", "--model", setup["model"], "--task", setup["task"], "--solver", f"gated:gate={gate}+fixed_k:k=2",
            "--block-size", "4", "--max-new-tokens", "8", "--plugins", setup["plugins"]["gate"], "--no-report",
            "--no-cost-curve", "--threads", "1", "--warmup", "0", "--out", out]
    first = sbd_process(*args)
    samples, deadline = out / "samples.jsonl", time.time() + 120
    while time.time() < deadline and first.poll() is None:
        if samples.exists() and samples.read_text().count("\n") >= 1:  # ntp's first sample; gated waits
            break
        time.sleep(0.02)
    assert first.poll() is None, first.stderr.read()[-2000:]
    for second in (args, ["run", "--resume", out]):
        proc = subprocess.run([sys.executable, "-m", "sbd_bench", *map(str, second)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1, proc.stderr[-2000:]
        assert f"is being written by another run (pid {first.pid}" in err[0]
    assert first.poll() is None  # the refusals did not disturb the first run
    first.send_signal(signal.SIGINT)  # while it waits at the gate
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err[-2000:]
    gate.unlink()  # the resumed run decodes freely
    command = err.strip().splitlines()[-1].strip()
    assert command == f"python -m sbd_bench run --resume '{out}'"
    finish = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert finish.returncode == 0, finish.stderr[-2000:]
    records = read_records(samples)
    assert len(records) == len({metrics.sample_key(r) for r in records}) == 18  # none twice, none lost
    assert not (out / "run.lock").exists()


def test_records_without_a_summary_are_continued_by_run_out(setup, tmp_path, capsys):
    """A folder with samples.jsonl but no summary.json: `--resume` cannot know the settings and says
    so; the command that started it, run again, keeps its records and decodes only the rest. A record
    that is not part of that command's plan is refused, and the refusal changes nothing."""
    cfg = config(setup, tmp_path / "whole", "fixed_k:k=2", "slow")
    whole = read_records(run(cfg) / "samples.jsonl")
    out = tmp_path / "cut"
    out.mkdir()
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in whole[:5]))
    assert main(["run", "--resume", str(out)]) == 2
    assert "no summary.json" in capsys.readouterr().err

    argv = ["run", "--model", setup["model"], "--task", setup["task"], "--solver", "fixed_k:k=2", "--block-size", "4",
            "--max-new-tokens", "8", "--no-report", "--no-cost-curve", "--threads", "1", "--batch-size", "1",  # as run(cfg)
            "--out", str(out)]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "samples.jsonl").write_text(json.dumps({**whole[0], "config": "fixed_k:k=3"}) + "\n")
    before = sorted(p.name for p in foreign.iterdir()), (foreign / "samples.jsonl").read_bytes()
    assert main([*argv[:-1], str(foreign)]) == 2
    assert "is not a sample of this command's run" in capsys.readouterr().err
    assert (sorted(p.name for p in foreign.iterdir()), (foreign / "samples.jsonl").read_bytes()) == before

    assert main(argv) == 0
    records = read_records(out / "samples.jsonl")
    assert records[:5] == whole[:5]  # kept as they were
    assert comparable(records) == comparable(whole)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["provenance"]["resumed"][0]["records_kept"] == 5


def test_model_identity_is_weights_config_and_tokenizer(tiny_models, tmp_path):
    """A model card or training log edited does not make the same weights "another model" (the
    baseline's and a resumed run's check); a changed weight, config or tokenizer file does."""
    import shutil

    from sbd_bench.core.model import folder_hash

    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], folder)
    before = folder_hash(folder)
    (folder / "README.md").write_text("# a card\n")
    (folder / "curve.png").write_bytes(b"\x89PNG")
    for name in ("training_args.json", "training_log.jsonl", "training_stages.jsonl"):
        (folder / name).write_text('{"step": 1}\n')
    assert folder_hash(folder) == before
    for name in ("config.json", "tokenizer_config.json"):
        changed = tmp_path / name
        shutil.copytree(folder, changed)
        (changed / name).write_text((changed / name).read_text().replace("{", '{"x": 1, ', 1))
        assert folder_hash(changed) != before, name
