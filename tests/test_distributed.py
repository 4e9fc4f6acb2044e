"""Data-parallel runs under torchrun on CPU (gloo): 2 ranks write what 1 process writes (timings
aside); a failing rank fails the whole run clearly; more ranks than examples is a clear error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scale_models import build_scale_model as build_tiny_model
from sbd_bench.runner.distributed import DistributedError, merge_in_order, shard_work

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"wall_time_s", "prefill_time_s", "decode_time_s", "peak_memory_bytes", "peak_memory_source", "memory"}


def _timing(key: str) -> bool:  # summary row fields that come from clocks or memory readings
    return any(word in key for word in ("wall", "e2e", "time", "memory"))  # e2e: end-to-end wall-clock
PROMPTS = ["1+2=", "12*3=", "abc", "9", "44+55-3="]
SOLVERS = "entropy_bounded+random_order+random_order:verify=on"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    model = build_tiny_model(root / "model")
    task = root / "mini.jsonl"
    task.write_text("".join(json.dumps({"id": str(i), "prompt": p, "answer": "8"}) + "\n" for i, p in enumerate(PROMPTS)))
    return model, task


def _cli(args: list[str], ranks: int = 1, env: dict | None = None):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 else [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([*launcher, "-m", "sbd_bench", "run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _common(model, task, out):
    return ["--model", str(model), "--task", str(task), "--out", str(out), "--device", "cpu", "--dtype", "float32",
            "--block-size", "4", "--max-new-tokens", "8", "--solver", SOLVERS,
            "--no-cost-curve", "--batch-size", "1"]  # as RunConfig's default, which the one-process run takes


def _load(out: Path):
    samples = [{k: v for k, v in json.loads(line).items() if k not in TIMING}
               for line in (out / "samples.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    rows = [{k: v for k, v in row.items() if not _timing(k)} for row in summary["rows"]]
    return samples, rows, summary


def test_two_ranks_write_what_one_process_writes(setup, tmp_path):
    from sbd_bench.runner.harness import RunConfig, run

    model, task = setup
    run(RunConfig(model=str(model), tasks=[str(task)], solvers=SOLVERS, out=tmp_path / "one",
                  block_size=4, max_new_tokens=8, device="cpu", dtype="float32", cost_curve=False))
    done = _cli(_common(model, task, tmp_path / "two"), ranks=2)
    assert done.returncode == 0, done.stderr[-2000:]
    one_samples, one_rows, _ = _load(tmp_path / "one")
    two_samples, two_rows, two_summary = _load(tmp_path / "two")
    assert len(one_samples) == 20 and two_samples == one_samples
    assert two_rows == one_rows
    assert two_summary["complete"] is True and two_summary["provenance"]["world_size"] == 2
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    assert json.loads(done.stdout.strip().splitlines()[-1])["complete"] is True  # rank 0 alone reports


def test_a_failing_rank_fails_the_run(setup, tmp_path):
    model, task = setup
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "fails_on_rank_one.py").write_text(
        "import os\nif os.environ.get('RANK') == '1':\n    raise RuntimeError('injected failure on rank 1')\n")
    done = _cli([*_common(model, task, tmp_path / "run"), "--plugins", str(plugins)], ranks=2)
    assert done.returncode != 0
    assert "error: rank 1 of 2 failed" in done.stderr and "injected failure on rank 1" in done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["complete"] is False and "rank 1" in summary["error"]


def test_more_ranks_than_examples_is_a_clear_error(setup, tmp_path):
    """Checked on every rank before the rendezvous, so one process with torchrun's environment for
    rank 0 of 2 shows what each rank prints (no second process needed)."""
    model, task = setup
    torchrun_env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = _cli([*_common(model, task, tmp_path / "run"), "--limit", "1"], env=torchrun_env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: torchrun started 2 ranks for 1 examples: start at most 1 "
                                                "processes (--nproc-per-node x --nnodes), or run more examples"]
    assert not (tmp_path / "run").exists()


def test_split_is_deterministic_and_merge_restores_the_order():
    work = list(range(7))
    shares = [shard_work(work, rank, 3) for rank in range(3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]
    records = [[{"task": "t", "id": str(i), "solver": s} for i in share for s in ("a", "b")] for share in shares]
    assert [(r["id"], r["solver"]) for r in merge_in_order(records)] == [(str(i), s) for i in work for s in ("a", "b")]
    with pytest.raises(DistributedError, match="4 ranks for 3 examples"):
        shard_work([1, 2, 3], 0, 4)


def test_a_folder_made_meanwhile_by_another_rank_is_no_error(tmp_path, monkeypatch):
    """torchrun's ranks prepare OUT/.rankR at the same moment: a parent another rank made between the
    check and the mkdir is used, and only what this process made counts as its own."""
    from sbd_bench.analysis.records import prepare_output_folder

    real_mkdir, out = Path.mkdir, tmp_path / "out"

    def raced(self, *args, **kwargs):
        if self == out:  # the other rank wins the race for the shared parent
            real_mkdir(self)
            raise FileExistsError(17, "File exists", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", raced)
    assert prepare_output_folder(out / ".rank0") == [out / ".rank0"]
    assert (out / ".rank0").is_dir()
