"""Every bad input is refused in one line, through a real process (`python -m sbd_bench ...`), as a
user sees it: exit status 2, exactly one line on stderr starting with "error: " and naming the
problem, no traceback, nothing written in the working folder, and every run folder it was pointed at
byte for byte as it was. None of these loads a model: each is refused before that."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from measure_fixtures import crafted_run, standard_records
from sbd_bench.analysis.records import RunFolderLock

ROOT = Path(__file__).resolve().parent.parent
RESUMABLE = {"model": "sbd-tiny", "tasks": ["arith"], "solvers": "all", "block_size": 4, "limit": 2}


def sbd(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "sbd_bench", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def damaged_run(path: Path, line: int, value=None, field: str | None = None, raw: bytes | None = None) -> Path:
    """A resumable run folder (its summary holds settings) whose samples.jsonl line ``line`` (1-based)
    has ``field`` set to ``value``, or is replaced by the bytes ``raw``."""
    records = standard_records(n=2)
    crafted_run(path, records, complete=False)
    lines = [json.dumps(r).encode() for r in records]
    lines[line - 1] = raw if raw is not None else json.dumps({**records[line - 1], field: value}).encode()
    (path / "samples.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    summary = json.loads((path / "summary.json").read_text())
    summary["provenance"]["config"] = RESUMABLE
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture(scope="module")
def w(tmp_path_factory) -> dict:
    """The bad inputs, each a file or a folder in one place."""
    root = tmp_path_factory.mktemp("bad")
    files = {
        "task_not_utf8": b'{"id": "a", "prompt": "caf\xe9"}\n',
        "task_stop_string": b'{"id": "a", "prompt": "1+1=", "stop": "cb"}\n',
        "train_not_utf8": b'{"prompt": "1+1=", "completion": "\xff2"}\n',
        "train_number": b'{"prompt": "1+1=", "completion": 2}\n',
        "gsm8k_not_utf8": b'{"question": "caf\xe9?", "answer": "#### 1"}\n',
    }
    paths = {}
    for name, data in files.items():
        (root / f"{name}.jsonl").write_bytes(data)
        paths[name] = root / f"{name}.jsonl"
    (root / "a_file").write_text("not a folder\n")
    paths["a_file"] = root / "a_file"
    paths["broken_model"] = root / "broken_model"
    paths["broken_model"].mkdir()
    (paths["broken_model"] / "config.json").write_text('{"model_type": "no_such_architecture"}')
    paths["good_run"] = crafted_run(root / "good_run", standard_records(n=2))
    for field, value in (("nfe", "many"), ("tokens", None), ("correct", "yes"), ("accepted_per_block", "all")):
        paths[f"run_{field}"] = damaged_run(root / f"run_{field}", 3, value, field)
    paths["run_garbage_line_4"] = damaged_run(root / "run_garbage_line_4", 4, raw=b"garbage")
    paths["run_not_utf8"] = damaged_run(root / "run_not_utf8", 2, raw=b'{"task": "caf\xe9"}')
    paths["no_summary"] = root / "no_summary"
    paths["no_summary"].mkdir()
    (paths["no_summary"] / "samples.jsonl").write_text(json.dumps(standard_records(n=1)[0]) + "\n")
    paths["busy"] = damaged_run(root / "busy", 1, raw=json.dumps(standard_records(n=1)[0]).encode())
    paths["root"] = root
    return paths


# (argv with {name} standing for a path of `w`, what the one line must say)
CASES = {
    "task file not UTF-8": ("run --task {task_not_utf8}", "task_not_utf8.jsonl:1: not UTF-8 text"),
    "benchmark file not UTF-8": ("run --task gsm8k:path={gsm8k_not_utf8}", "not UTF-8 text"),
    "training file not UTF-8": ("train --data {train_not_utf8} --out {root}/t1", "train_not_utf8.jsonl:1: not UTF-8"),
    "--device tpu": ("run --device tpu", "unknown --device 'tpu'"),
    "train --device tpu": ("train --device tpu --out {root}/t2", "unknown --device 'tpu'"),
    # a model that cannot load: the --out checks must come first (before any model loads)
    "run --out a file": ("run --model {broken_model} --out {a_file}", "is a file, not a folder"),
    "run --out under a file": ("run --model {broken_model} --out {a_file}/run", "which is a file"),
    "run --out under /proc": ("run --model {broken_model} --out /proc/sbd-bench-run",
                              "cannot write to --out /proc/sbd-bench-run"),
    "run --out unwritable": ("run --model {broken_model} --out {unwritable}/run", "cannot write to --out"),
    "a model that cannot load (the control)": ("run --model {broken_model} --out {root}/r1", "broken_model"),
    "report --out a file": ("report {good_run} --out {a_file}", "is a file, not a folder"),
    "train --out a file": ("train --out {a_file}", "is a file, not a folder"),
    "train --out under a file": ("train --out {a_file}/model", "which is a file"),
    "throughput --out a folder": ("throughput --out {root}", "is a folder: give a file name"),
    "compare --out a folder": ("compare {good_run} {good_run} --out {root}", "is a folder: give a file name"),
    "train --hidden-size 30 --heads 4": ("train --hidden-size 30 --heads 4 --out {root}/t3", "not divisible by --heads 4"),
    "compare --wall-tol nan": ("compare {good_run} {good_run} --wall-tol nan", "--wall-tol must be a number >= 0"),
    "compare --nfe-tol inf": ("compare {good_run} {good_run} --nfe-tol inf", "--nfe-tol must be a number >= 0"),
    "roofline --hardware TPU": ("roofline --hardware TPU --dims llama-3.1-8b", "unknown --hardware TPU"),
    "roofline --hardware TPU on a run": ("roofline {good_run} --hardware TPU", "unknown --hardware TPU"),
    "roofline --block-size 0": ("roofline --dims llama-3.1-8b --block-size 0", "--block-size must be >= 1"),
    "roofline --context -1": ("roofline --dims llama-3.1-8b --context -1", "--context must be >= 0"),
    "roofline --batch 0": ("roofline --dims llama-3.1-8b --batch 0", "--batch must be >= 1"),
    "task stop is a string": ("run --task {task_stop_string}", "'stop' must be a list of non-empty strings"),
    "train completion is a number": ("train --data {train_number} --out {root}/t4", "'completion' is 2, not a string"),
    "resume a folder without summary": ("run --resume {no_summary}", "holds samples.jsonl but no summary.json"),
    "resume, garbage on line 4": ("run --resume {run_garbage_line_4}", "samples.jsonl:4 is not valid JSON"),
    "resume, records not UTF-8": ("run --resume {run_not_utf8}", "samples.jsonl:2 is not UTF-8 text"),
    "run into a folder another run writes": ("run --task arith --out {busy}", "is being written by another run (pid"),
    "resume a folder another run writes": ("run --resume {busy}", "is being written by another run (pid"),
}
for _field, _value in (("nfe", '"many"'), ("tokens", "null"), ("correct", '"yes"'), ("accepted_per_block", '"all"')):
    _where = f"samples.jsonl:3: field '{_field}' is {_value}"
    CASES[f"report, {_field}={_value}"] = (f"report {{run_{_field}}}", _where)
    CASES[f"compare, {_field}={_value}"] = (f"compare {{good_run}} {{run_{_field}}}", _where)
    CASES[f"roofline, {_field}={_value}"] = (f"roofline {{run_{_field}}}", _where)
    CASES[f"run --resume, {_field}={_value}"] = (f"run --resume {{run_{_field}}}", _where)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_changes_nothing(case, w, tmp_path):
    argv, expected = CASES[case]
    unwritable = Path("/sys/sbd-bench") if os.geteuid() == 0 else tmp_path / "locked"  # root writes anywhere else
    if os.geteuid() != 0:
        unwritable.mkdir()
        unwritable.chmod(0o500)
    folders = [p for p in w.values() if p.is_dir() and p != w["root"]]
    before = {p: snapshot(p) for p in folders}
    args = argv.format(**{k: str(v) for k, v in w.items()}, unwritable=unwritable).split()
    holder = RunFolderLock(w["busy"], command="the test's own run") if "another run" in case else None
    if holder:
        holder.__enter__()
    try:
        proc = sbd(*args, cwd=tmp_path)
    finally:
        if holder:
            holder.__exit__(None, None, None)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(err) == 1 and err[0].startswith("error: "), proc.stderr[-3000:]
    assert expected in err[0], err[0]
    if holder:
        assert f"pid {os.getpid()}" in err[0] and "the test's own run" in err[0]
    assert not (tmp_path / "runs").exists()  # no run folder started in the working folder
    for name in ("t1", "t2", "t3", "t4", "r1"):
        assert not (w["root"] / name).exists()  # a refused `train` or `run` leaves no output folder behind
    assert {p: snapshot(p) for p in folders} == before  # every run folder exactly as it was


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`list | head`: the reader goes away; no BrokenPipeError traceback, no message."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "sbd_bench", "list"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before it writes a byte: every write it makes now fails with EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err
