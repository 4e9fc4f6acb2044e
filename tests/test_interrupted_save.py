"""Ctrl-C at ten moments spread over one checkpoint write of `train` (item 14 of issue 38): each waits for the
write to finish (a KeyboardInterrupt inside torch's writer, C++ calling back into Python, can end the process
with SIGABRT), then ends with exit status 130 and the resume line for the checkpoint just written, and
`--resume` then ends with the weights of the run that was never interrupted. The moments are Python calls inside `checkpoint.save` (profiler events, torch's writer
calling back into Python among them), counted once in an uninterrupted run and spread evenly."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from children import sigint_at_default

ROOT = Path(__file__).resolve().parent.parent
CHILD = r'''
import contextlib, io, json, os, signal, sys
from pathlib import Path

from safetensors.torch import load_file

import sbd_bench.training.checkpoint as ckpt
from sbd_bench.cli import main

root, moments = Path(sys.argv[1]), int(sys.argv[2])
ARGS = ["train", "--data", "reverse", "--train-examples", "16", "--steps", "6", "--batch-size", "2", "--save-every", "2",
        "--log-every", "2", "--threads", "1", "--hidden-size", "32", "--layers", "2", "--heads", "4",
        "--intermediate-size", "64", "--max-positions", "96"]
original, plan = ckpt.save, {"target": None, "calls": 0, "events": 0}


def count(frame, event, arg):
    plan["events"] += 1
    if plan["events"] == plan["target"]:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered at the next point Python checks for signals


def save(*args, **kwargs):  # the second save of the run (step 4) is the one interrupted
    plan["calls"] += 1
    if plan["calls"] != 2:
        return original(*args, **kwargs)
    plan["events"] = 0
    sys.setprofile(count)
    try:
        return original(*args, **kwargs)
    finally:
        sys.setprofile(None)


ckpt.save = save


def train(out, *more):
    plan["calls"], err = 0, io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(ARGS + ["--out", str(out), *more])
    return rc, err.getvalue()


rc, _ = train(root / "whole")
total, want = plan["events"], load_file(root / "whole" / "model.safetensors")
print(json.dumps({"reference": rc, "events": total}), flush=True)
for i in range(moments):
    plan["target"] = max(1, total * (2 * i + 1) // (2 * moments))
    out = root / f"cut{i}"
    rc, err = train(out)
    plan["target"] = None
    resumed, _ = train(out, "--resume")
    got = load_file(out / "model.safetensors") if resumed == 0 else {}
    same = set(got) == set(want) and all(got[k].equal(want[k]) for k in want)
    print(json.dumps({"at": plan["target"], "rc": rc, "err": err, "resumed": resumed, "same": same}), flush=True)
'''


def test_ctrl_c_anywhere_in_a_checkpoint_write_exits_130_and_resumes_exactly(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path), "10"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, preexec_fn=sigint_at_default)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])  # -6: SIGABRT
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["reference"] == 0 and lines[0]["events"] > 100
    assert len(lines) == 11
    for moment in lines[1:]:
        assert moment["rc"] == 130, moment
        # the signal waited for the write: the checkpoint being written (step 4) is the one kept
        assert "interrupted: the step-4 checkpoint is kept in" in moment["err"] and "--resume" in moment["err"], moment["err"]
        assert "Traceback" not in moment["err"]
        assert moment["resumed"] == 0 and moment["same"], moment


def test_signals_wait_during_a_write_and_a_second_one_acts_at_once():
    import signal

    from sbd_bench.training.checkpoint import _signals_wait

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with _signals_wait() as received:
            signal.raise_signal(signal.SIGINT)  # would raise KeyboardInterrupt here
            assert received == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        try:
            with _signals_wait():
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)  # the second: at once
            raise AssertionError("the second signal did not interrupt")
        except KeyboardInterrupt:
            pass
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
