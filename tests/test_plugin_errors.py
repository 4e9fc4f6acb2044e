"""A plugin's mistakes, as its author meets them: its own exception and a `select` that returns None are one
line each naming the plugin's file:line and the rule (SBD_BENCH_TRACEBACK=1 adds the traceback), and a
solver that writes into its view cannot corrupt the core's block (docs/solvers.md, 'Writing a solver')."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.types import Decision, Solver, reveal_top

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = '''from typing import ClassVar
from sbd_bench.types import Solver


class Raises(Solver):
    name: ClassVar[str] = "raises"

    def select(self, view):
        raise ValueError("my plugin's own bug")  # line 9


class ReturnsNone(Solver):
    name: ClassVar[str] = "returns_none"

    def select(self, view):  # line 15
        view.masked.any()
'''


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    (root / "plugins").mkdir()
    (root / "plugins" / "mistakes.py").write_text(PLUGIN)
    (root / "task.jsonl").write_text('{"id": "a", "prompt": "1+2=", "answer": "3"}\n')

    def run(out: str, **env):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
        return subprocess.run([sys.executable, "-m", "sbd_bench", "run", "--plugins", "plugins", "--task", "task.jsonl",
                               "--solver", "raises+returns_none", "--block-size", "4", "--max-new-tokens", "8",
                               "--threads", "1", "--warmup", "0", "--no-cost-curve", "--no-report", "--out", out],
                              cwd=root, env=env, capture_output=True, text=True, timeout=300)

    return root, run("run"), run("run-tb", SBD_BENCH_TRACEBACK="1")


def test_a_plugin_error_names_its_file_and_line(failed):
    root, proc, _ = failed
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("failed: ")]
    raised = next(line for line in lines if line.startswith("failed: raises "))
    assert "ValueError: my plugin's own bug (at " in raised and "mistakes.py:9;" in raised
    assert "SBD_BENCH_TRACEBACK=1 prints the traceback" in raised
    none = next(line for line in lines if line.startswith("failed: returns_none "))
    assert "select returned None; it must return a bool tensor" in none and "mistakes.py:15)" in none


def test_the_traceback_on_request(failed):
    _, _, proc = failed
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    assert 'mistakes.py", line 9, in select' in proc.stderr


class Scribbler(Solver):
    """Reveals the most confident slot; writes garbage into every tensor of its view first."""

    name = "scribbler"
    reads_history = True

    def select(self, view):
        reveal = reveal_top(view.confidence, view.masked, 1)
        view.block.fill_(0)
        view.revealed_at.fill_(7)
        return Decision(reveal=reveal)


class Clean(Scribbler):
    name = "clean"

    def select(self, view):
        return Decision(reveal=reveal_top(view.confidence, view.masked, 1))


def test_a_solver_that_writes_into_its_view_cannot_corrupt_the_block(tiny_models):
    lm = load_model(tiny_models["llama"], device="cpu", dtype="float32")
    for prompts in ([[5, 6, 7]], [[5, 6, 7], [8, 9]]):  # batch 1: the view's tensors were the core's own
        torch.manual_seed(0)
        decoder = Decoder(lm, block_size=4, max_new_tokens=8)
        got = decoder.generate_batch(prompts, Scribbler())
        want = decoder.generate_batch(prompts, Clean())
        assert [g.output_ids for g in got] == [w.output_ids for w in want]
        assert [g.nfe for g in got] == [w.nfe for w in want]
