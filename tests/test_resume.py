"""Nothing lost: a run killed by a real signal keeps its finished samples, `run --resume` finishes only
what is missing, and the records then equal those of an uninterrupted run (timings aside); a
configuration that fails is recorded with its error and the sweep goes on."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
           "--plugins", setup["plugins"]["slow"], "--no-report", "--no-cost-curve", "--threads", "1", "--out", str(killed)]
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
    assert summary["complete"] is True and len(summary["resumed"]) == 1


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
    assert main(["run", "--resume", str(out)]) == 0  # through the CLI this time
    records = read_records(out / "samples.jsonl")
    assert len(records) == len({metrics.sample_key(r) for r in records}) == 12
    assert json.loads((out / "summary.json").read_text())["complete"] is True


def test_failing_configuration_is_recorded_and_the_sweep_goes_on(setup, tmp_path):
    out = run(config(setup, tmp_path / "fail", "always_oom+fixed_k:k=2", "fail"))
    records = read_records(out / "samples.jsonl")
    failed = [r for r in records if r["solver"] == "always_oom"]
    assert len(records) == 18 and len(failed) == 6
    assert all(r["error"] == "OutOfMemoryError: CUDA out of memory (planted)" for r in failed)
    assert all(r["error"] is None for r in records if r["solver"] != "always_oom")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True and len(summary["failures"]) == 6
    row = next(r for r in summary["rows"] if r["solver"] == "always_oom")
    assert row["errors"] == 6 and row["n"] == 0


def test_resume_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a run folder" in err
