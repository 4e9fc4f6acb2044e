"""`train` under torchrun on the CPU (gloo): 2 ranks train the model one process trains with the same
global batch. Four 2-rank launches, three of 20 steps of a tiny Llama in fp32 (about 20 s each on 2 cores):

  FSDP, killed (SIGKILL) after its step-10 sharded save, then resumed to step 20 and exported (it runs
        with --stop-at 15: if the kill comes late, the run has saved step 15 and left; either way the
        resumed run must give the uninterrupted losses)
  DDP with --grad-accum 2 and one sequence per rank (the same global batch of 4)
  --measure-throughput 2 (SBD and NTP side by side on both ranks, a ratio per window)
and in-process: the one-process reference (batch 4), --grad-accum 2 against the doubled batch, and the
FSDP checkpoint of step 10 resumed in one process (a checkpoint of another world size is resharded).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sbd_bench.training.checkpoint import latest, read_meta
from sbd_bench.training.config import TrainConfig, TrainError
from sbd_bench.training.train import train

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(data="reverse", steps=20, train_examples=64, hidden_size=32, layers=2, heads=4, intermediate_size=64,
            max_positions=96, threads=1, log_every=1, save_every=10, lr=3e-3, warmup=5)
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
REL = 1e-5  # fp32, same global batch: the ranks' slices sum in another order, nothing more


def torchrun(out: Path | None, *flags: str, kill_at: str | None = None, base=FLAGS) -> subprocess.CompletedProcess | str:
    """2 ranks of `train`. ``kill_at``: SIGKILL the whole process group when a log line starts with it.

    ``--standalone`` takes a free port: a fixed one can still be held (TIME_WAIT) by the run killed just before,
    or by another test run on the machine."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "-m", "sbd_bench", "train", *(["--out", str(out)] if out else []), *base, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if kill_at is None:
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith(kill_at):
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    return "".join(seen)


def losses(out: Path, key: str = "loss") -> list[float]:
    return [json.loads(line)[key] for line in (out / "training_log.jsonl").read_text().splitlines() if '"step"' in line]


def close(a: list[float], b: list[float], rel: float = REL) -> bool:
    """Equal to ``rel``; the largest relative difference is printed (pytest -s: docs/training.md's figures)."""
    if len(a) != len(b):
        return False
    largest = max(abs(x - y) / abs(x) if x else abs(y) for x, y in zip(a, b))
    print(f"per-step values within {largest:.1e} relative")
    return largest <= rel


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    train(TrainConfig(out=str(root / "one"), batch_size=4, **TINY), log=lambda line: None)
    seen = torchrun(root / "fsdp", "--batch-size=2", "--save-every=5", "--stop-at=15",
                    kill_at="checkpoint: step 10")
    assert "checkpoint: step 10" in seen, seen[-3000:]
    shutil.copytree(root / "fsdp", root / "fsdp_at_10")  # for the one-process resume below
    resumed = torchrun(root / "fsdp", "--batch-size=2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ddp = torchrun(root / "ddp", "--batch-size=1", "--grad-accum=2", "--strategy=ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    return root, resumed, ddp


def test_fsdp_killed_and_resumed_gives_the_one_process_losses(runs):
    root, resumed, _ = runs
    one = losses(root / "one")
    assert len(one) == 20
    assert close(losses(root / "fsdp"), one)  # steps 1-10 before the kill, 11-20 after the resume
    assert close(losses(root / "fsdp", "grad_norm"), losses(root / "one", "grad_norm"))
    stages = [json.loads(line) for line in (root / "fsdp" / "training_stages.jsonl").read_text().splitlines()]
    assert [(s["strategy"], s["world_size"], s["batch_size"], s["grad_accum"], s["global_batch_size"], s["resume"],
             s["from_step"]) for s in stages[:1]] == [("fsdp", 2, 2, 1, 4, False, 0)]
    assert [(s["resume"], s["world_size"]) for s in stages[1:]] == [(True, 2)] and stages[1]["from_step"] in (10, 15)
    assert stages[0]["command"].startswith("torchrun --nproc-per-node 2 -m sbd_bench train")
    # --plan's FSDP arithmetic against the shard the largest rank really held
    from sbd_bench.training.model import build_model
    from sbd_bench.training.plan import meta_model, plan

    config = build_model(TrainConfig(out="", **TINY), None)[0].config
    predicted = plan(meta_model(config), 2, "fsdp", 2, 48, cuda=False)
    assert stages[0]["param_bytes_per_rank"] == predicted.weights * 1e9
    assert "Traceback" not in resumed.stderr and json.loads(resumed.stdout.splitlines()[-1])["steps"] == 20


def test_ddp_with_accumulation_gives_the_one_process_losses(runs):
    root, _, ddp = runs
    assert close(losses(root / "ddp"), losses(root / "one"))
    stage = json.loads((root / "ddp" / "training_stages.jsonl").read_text().splitlines()[0])
    assert (stage["strategy"], stage["world_size"], stage["batch_size"], stage["grad_accum"]) == ("ddp", 2, 1, 2)


def test_the_two_rank_exports_equal_the_one_process_weights_and_decode(runs, tmp_path):
    from sbd_bench.cli import main

    root, _, _ = runs
    one = load_file(root / "one" / "model.safetensors")
    for name in ("fsdp", "ddp"):
        other = load_file(root / name / "model.safetensors")
        assert sorted(other) == sorted(one)
        largest = max(float((one[k] - other[k]).abs().max()) for k in one)
        print(f"{name} export: weights within {largest:.1e} of the one-process run's")
        assert largest <= 1e-6
        for file in ("config.json", "tokenizer.json", "tokenizer_config.json", "training_stages.jsonl"):
            assert (root / name / file).is_file()
    # --export in one process from the 2-rank sharded checkpoint: the folder the run itself exported
    from sbd_bench.training.checkpoint import export_checkpoint

    exported = export_checkpoint(root / "fsdp", tmp_path / "exported", log=lambda line: None)
    again = load_file(exported / "model.safetensors")
    fsdp = load_file(root / "fsdp" / "model.safetensors")
    assert sorted(again) == sorted(fsdp) and all(torch.equal(again[k], fsdp[k]) for k in fsdp)
    assert (exported / "training_stages.jsonl").read_text() == (root / "fsdp" / "training_stages.jsonl").read_text()
    config = json.loads((root / "fsdp" / "config.json").read_text())
    assert config["mask_token_id"] == json.loads((root / "one" / "config.json").read_text())["mask_token_id"]
    rc = main(["run", "--model", str(root / "fsdp"), "--solver", "all", "--task", "reverse", "--limit", "2",
               "--device", "cpu", "--threads", "1", "--no-cost-curve", "--out", str(tmp_path / "run")])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert rc == 0 and summary["complete"] and len(summary["rows"]) > 5


def test_a_two_rank_checkpoint_resumes_in_one_process(runs):
    """Another world size is resharded, not refused: the same global batch continues the same run."""
    root, _, _ = runs
    split = root / "fsdp_at_10"
    assert read_meta(latest(split))["world_size"] == 2 and read_meta(latest(split))["step"] in (10, 15)
    lines = []
    train(TrainConfig(out=str(split), batch_size=4, resume=True, **TINY), log=lines.append)
    assert any("resharded" in line for line in lines)
    assert close(losses(split), losses(root / "one"))
    # a global batch that differs from the checkpoint's is refused, before anything loads
    with pytest.raises(TrainError, match="global batch of 4"):
        train(TrainConfig(out=str(split), batch_size=2, resume=True, **TINY), log=lambda line: None)


def test_grad_accum_equals_the_doubled_batch(runs, tmp_path):
    root, _, _ = runs
    train(TrainConfig(out=str(tmp_path / "accum"), batch_size=2, grad_accum=2, **TINY), log=lambda line: None)
    assert close(losses(tmp_path / "accum"), losses(root / "one"))


def test_throughput_is_measured_per_window_under_torchrun():
    """SBD and NTP copies side by side on both ranks, the global batch, a ratio per --log-every window."""
    timed = [flag for flag in FLAGS if flag.split("=")[0] not in ("--steps", "--save-every", "--warmup")]  # it trains
    done = torchrun(None, "--measure-throughput=2", "--batch-size=2", base=timed)  # no schedule and saves nothing
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["world_size"], result["strategy"], result["global_batch_size"], result["steps"]) == (2, "fsdp", 4, 2)
    assert [w["steps"] for w in result["windows"]] == [1, 2] and all(w["sbd_over_ntp"] > 0 for w in result["windows"])
    windows = [line for line in done.stderr.splitlines() if "SBD/NTP =" in line]
    assert len(windows) == 3 and windows[0].startswith("[1/2] SBD ")  # rank 0 alone: two windows, then the total
