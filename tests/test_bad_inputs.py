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

from children import sigint_at_default
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
    "run --temperature -1": ("run --temperature -1 --out {root}/r2", "--temperature must be a number >= 0 (got -1.0)"),
    "run --top-p 0": ("run --temperature 0.7 --top-p 0 --out {root}/r2", "--top-p must be in (0, 1] (got 0.0)"),
    "run --top-p 1.5": ("run --top-p 1.5 --out {root}/r2", "--top-p must be in (0, 1] (got 1.5)"),
    "run --top-k -1": ("run --top-k -1 --out {root}/r2", "--top-k must be an integer >= 0 (got -1)"),
    "run --samples 0": ("run --samples 0 --out {root}/r2", "--samples must be >= 1 (got 0)"),
    "pass@k with k > N": ("run --samples 4 --pass-k 8 --out {root}/r2", "--pass-k 8 needs 1 <= k <= --samples (4)"),
    "a spec's temperature < 0": ("run --solver entropy_bounded:temperature=-0.5 --out {root}/r2",
                                 "entropy_bounded: temperature must be a number >= 0 (got -0.5)"),
    "a spec's top_p > 1": ("run --solver ntp:temperature=1;top_p=2 --out {root}/r2", "ntp: top_p must be in (0, 1]"),
    "throughput --temperature -1": ("throughput --temperature -1 --out {root}/tp.json",
                                    "--temperature must be a number >= 0"),
    "tune --max-loss 1": ("tune --solver entropy_bounded:gamma=0.1,0.35 --max-loss 1", "--max-loss must lie strictly "
                                                                                      "between 0 and 1 (got 1.0)"),
    "tune, a task too small for the split": ("tune --solver entropy_bounded:gamma=0.1,0.35 --task arith",
                                             "tune needs 520 examples of task arith"),
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
    for name in ("t1", "t2", "t3", "t4", "r1", "r2", "tp.json"):
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


# ------------------------------------------------------------------------------------------------------
# Issue 20 (inputs): a user's files are never replaced; bad values refused up front; messages that name
# what the user typed and a fix that works; a closed pipe costs no work; a broken model is named.
# Each refusal runs with a model that cannot load where it can: the check must come before the model.

@pytest.fixture(scope="module")
def mine(tmp_path_factory, w) -> dict:
    """The folders and files of the cases below: a user's files beside run folders, and broken models."""
    import shutil

    root = tmp_path_factory.mktemp("inputs")
    paths = {"root": root}
    paths["their_summary"] = root / "their_summary"  # someone's summary.json, no records
    paths["their_summary"].mkdir()
    (paths["their_summary"] / "summary.json").write_text('{"accuracy": 0.9}\n')
    paths["their_report"] = root / "their_report"  # the user's own report and table
    paths["their_report"].mkdir()
    (paths["their_report"] / "report.md").write_text("# my notes\n")
    (paths["their_report"] / "table.csv").write_text("a,b\n1,2\n")
    paths["run"] = crafted_run(root / "run", standard_records(n=2))  # a finished run
    paths["runs"] = root  # a folder holding folders, and no file by compare's suggested name
    paths["tasks"] = root / "tasks"
    paths["tasks"].mkdir()
    (paths["tasks"] / "a.jsonl").write_text('{"id": "a", "prompt": "1+1="}\n')
    paths["chat_task"] = root / "chat_task.jsonl"
    paths["chat_task"].write_text('{"id": "a", "messages": [{"role": "user", "content": "1+1="}]}\n')
    shipped = ROOT / "models" / "sbd-tiny"
    paths["no_tokenizer"] = root / "no_tokenizer"
    paths["no_tokenizer"].mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(shipped / name, paths["no_tokenizer"] / name)
    paths["mismatched"] = root / "mismatched"  # the config of a model twice as wide
    shutil.copytree(shipped, paths["mismatched"])
    config = json.loads((shipped / "config.json").read_text())
    (paths["mismatched"] / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    paths["nan_model"] = nan_model(root / "nan_model", shipped)
    return paths


def nan_model(path: Path, shipped: Path) -> Path:
    """sbd-tiny with every weight NaN: what a training run whose loss became NaN saves."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(shipped, path)
    weights = {name: torch.full_like(t, float("nan")) for name, t in load_file(shipped / "model.safetensors").items()}
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


# (argv with {name} a path of `mine` or `w`, what the one line must say)
REFUSED = {
    "run --out: someone's summary.json": ("run --model {broken_model} --out {their_summary}",
                                          "--out {their_summary} holds summary.json, which sbd_bench did not write"),
    "run --out: the user's report": ("run --model {broken_model} --out {their_report}",
                                     "holds report.md, table.csv, which sbd_bench did not write"),
    "report --out: the user's report": ("report {run} --out {their_report}", "holds report.md, table.csv"),
    "compare --out a run's records": ("compare {run} {run} --out {run}/samples.jsonl",
                                      "--out {run}/samples.jsonl is a file `compare` did not write"),
    "throughput --out a run's summary": ("throughput --model {broken_model} --out {run}/summary.json",
                                         "--out {run}/summary.json is a file `throughput` did not write"),
    "--seed past torch's range": ("run --model {broken_model} --solver random_order --seed 99999999999999999999999",
                                  "--seed must be between 0 and 2**64 - 1"),
    "a spec key given twice": ("run --model {broken_model} --solver entropy_bounded:gamma=0.1;gamma=0.5",
                               "entropy_bounded: parameter 'gamma' is given twice"),
    "--max-block-forwards below the block size": ("run --model {broken_model} --block-size 8 --max-block-forwards 7",
                                                  "--max-block-forwards must be at least the block size 8 (got 7)"),
    "tune --max-block-forwards below the block size": (
        "tune --model {broken_model} --block-size 4 --max-block-forwards 3 --solver fixed_k:k=1,2 --task arith",
        "--max-block-forwards must be at least the block size 4 (got 3)"),
    "an integer parameter past int64": ("run --model {broken_model} --solver fixed_k:k=99999999999999999999",
                                        "fixed_k: k=99999999999999999999 is out of range"),
    "--resume with other flags": ("run --resume {run} --sol ntp --task reverse --limit 1 --no-fast",
                                  "drop --no-fast, --limit, --sol, --task"),
    "compare --accuracy-tol 5": ("compare {run} {run} --accuracy-tol 5", "write --accuracy-tol 0.05"),
    "--chat-template, synthetic task": ("run --model {broken_model} --task arith --chat-template",
                                        "--chat-template applies to the benchmark tasks"),
    "JSONL messages without --chat-template": ("run --model {broken_model} --task {chat_task}",
                                               "{chat_task}:1: 'messages' is a conversation for the model's chat "
                                               "template: add --chat-template"),
    "--thinking on, synthetic task": ("run --model {broken_model} --task arith --thinking on",
                                      "--thinking on applies to the benchmark tasks (humaneval"),
    "--thinking on, JSONL task": ("run --model {broken_model} --task {tasks}/a.jsonl --thinking on",
                                  "--thinking only applies through a chat template: add --chat-template"),
    "--model README.md": ("run --model {readme}", "model '{readme}' is a file, not a model folder: give a local "
                                                  "Hugging Face folder (config.json + weights + tokenizer) or a shipped"),
    "--model a file": ("run --model {broken_model}/config.json", "is a file, not a model folder: give the folder "
                                                                  "that holds it, {broken_model}"),
    "--task a folder": ("run --model {broken_model} --task {tasks}", "is a folder: give one of the 1 in it, "
                                                                     "e.g. {tasks}/a.jsonl"),
    "--resume a file": ("run --resume {run}/summary.json", "is a file: give the run folder that holds it: "
                                                           "--resume {run}"),
    "compare --out a folder": ("compare {run} {run} --out {runs}", "give a file name, e.g. --out {runs}/compare.md"),
    "a model folder without tokenizer": ("run --model {no_tokenizer} --task arith --limit 1 --solver ntp", "has no tokenizer (none of tokenizer.json"),
    "config and weights that differ": ("run --model {mismatched} --task arith --limit 1 --solver ntp", "tensors differ in shape (e.g. "),
    "a model that computes NaN": ("run --model {nan_model} --task arith --limit 1 --solver entropy_bounded",
                                  "computes NaN or infinite logits"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_in_one_line(case, mine, w, tmp_path):
    argv, expected = REFUSED[case]
    names = {k: str(v) for k, v in {**w, **mine, "readme": ROOT / "README.md"}.items()}
    folders = [p for p in mine.values() if p.is_dir() and p != mine["root"]]
    before = {p: snapshot(p) for p in folders}
    proc = sbd(*argv.format(**names).split(), cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), proc.stderr[-3000:]
    assert expected.format(**names) in err[0], err[0]
    assert {p: snapshot(p) for p in folders} == before and not list(tmp_path.iterdir())


def test_the_suggested_fixes_work(mine, tmp_path):
    """What the messages above suggest does what they say: the run folder for --resume (a finished run:
    nothing to do, no model loaded, nothing rewritten), a free file name for compare --out."""
    run = mine["run"]
    before = snapshot(run)
    proc = sbd("run", "--resume", run, cwd=tmp_path)
    assert proc.returncode == 0 and f"{run} is complete" in proc.stderr and "nothing to resume" in proc.stderr
    assert snapshot(run) == before  # no report rewritten, no `resumed` entry
    proc = sbd("compare", run, run, "--out", mine["runs"] / "compare.md", cwd=tmp_path)
    assert proc.returncode == 0 and (mine["runs"] / "compare.md").read_text().startswith("| config | task |")
    again = sbd("compare", run, run, "--out", mine["runs"] / "compare.md", cwd=tmp_path)
    assert again.returncode == 0  # its own earlier output is replaced, as before


def test_a_full_stdout_is_one_line(tmp_path):
    """`list > /dev/full`: ENOSPC on stdout is one line and exit 2, not a traceback."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "sbd_bench", "list"], cwd=tmp_path, env=env, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == ("error: cannot write stdout: No space left on device: "
                                                            "free some space, or send the output to another disk")


def test_a_broken_model_is_named_not_the_solver(mine, one_thread):
    """The core, when a solver seems to reveal nothing, looks at the logits first: NaN ones name the
    model (BrokenModelError), at batch 1 and batched, instead of blaming the solver's contract."""
    from sbd_bench.core.decoding import BrokenModelError, Decoder
    from sbd_bench.core.model import load_model
    from sbd_bench.registry import parse_solver_spec, solver_registry

    lm = load_model(mine["nan_model"], device="cpu")
    solver = parse_solver_spec("entropy_bounded", solver_registry())[-1]
    decoder = Decoder(lm, block_size=4, max_new_tokens=8)
    for generate in (lambda: decoder.generate([5, 6, 7], solver),
                     lambda: decoder.generate_batch([[5, 6, 7], [5, 6]], solver)):
        with pytest.raises(BrokenModelError, match="computes NaN or infinite logits"):
            generate()


@pytest.fixture(scope="module")
def decoded(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real run: a task file that starts with a UTF-8 BOM and holds characters sbd-tiny's tokenizer
    cannot encode, decoded by two configurations with long names that differ only in verify=on."""
    root = tmp_path_factory.mktemp("decoded")
    task = root / "bom_unicode.jsonl"
    task.write_bytes("\ufeff".encode() + b'{"id": "a", "prompt": "1+2=", "answer": "3"}\n'
                     + '{"id": "b", "prompt": "caf\u00e9 \u2192 2+3=", "answer": "5"}\n'.encode())
    proc = sbd("run", "--task", task, "--solver", "entropy_bounded:gamma=0.35;proxy=entropy;verify=on,off",
               "--block-size", "4", "--max-new-tokens", "8", "--threads", "1", "--warmup", "0", "--no-cost-curve",
               "--no-report", "--out", root / "run", cwd=root)
    return root / "run", proc


def test_bom_unknown_characters_and_long_names(decoded):
    run, proc = decoded
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {r["id"] for r in records} == {"a", "b"}  # the BOM was read as no content
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "2 prompt token(s) in 1 of 2 prompts are <unk>" in warnings[0], proc.stderr
    assert "'é' x1, '→' x1" in warnings[0]
    unknown = json.loads((run / "summary.json").read_text())["provenance"]["unknown_characters"]
    assert unknown == {"unk_token": "<unk>", "tokens": 2, "prompts": 1, "of_prompts": 2,
                       "characters": {"é": 1, "→": 1}}
    table = [line.split()[1] for line in proc.stderr.splitlines() if line.startswith("bom_unicode ")]
    assert sorted(table) == ["entropy_bounded:gamma=0.35,proxy=entropy",
                             "entropy_bounded:gamma=0.35,proxy=entropy,verify=on", "ntp"], proc.stderr


def test_the_table_wraps_long_names_in_a_narrow_terminal(capsys):
    """Where the line must fit a terminal, a long configuration name wraps at its commas, in its column:
    still whole, the verify=on that tells two rows apart included."""
    from sbd_bench.cli import _print_table

    names = ["entropy_bounded:gamma=0.35,proxy=entropy,verify=on", "entropy_bounded:gamma=0.35,proxy=entropy"]
    rows = [{"task": "arith", "config": name, "n": 1, "accuracy": 1.0, "nfe": 8.0, "tokens_per_forward": 4.0,
             "acceptance_rate": None, "speed_factor_nfe": 4.0, "speed_factor_wall": 2.0} for name in names]
    _print_table(rows, width=100)
    lines = capsys.readouterr().err.splitlines()
    assert max(len(line) for line in lines) <= 100
    config = lines[0].index("config")
    assert [line[config:].split()[0] for line in lines[1:]] == ["entropy_bounded:gamma=0.35,", "proxy=entropy,verify=on",
                                                                  "entropy_bounded:gamma=0.35,", "proxy=entropy"]


def test_a_closed_pipe_stops_at_a_sample_and_keeps_everything(tmp_path):
    """`run ... 2>&1 | head -2`: the reader goes away after two lines. The run stops after the sample in
    hand (exit 141) with every record kept, its summary and report saying how to resume; that command
    then finishes it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "sbd_bench", "run", "--task", "arith", "--limit", "8", "--solver",
                             "ntp,fixed_k", "--block-size", "4", "--threads", "1", "--warmup", "0", "--no-cost-curve",
                             "--out", str(out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    head = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()
    assert proc.wait(timeout=300) == 141, head
    summary = json.loads((out / "summary.json").read_text())
    records = (out / "samples.jsonl").read_text().splitlines()
    assert not summary["complete"] and summary["samples"] == {"planned": 16, "recorded": len(records)}
    assert 1 <= len(records) < 16
    assert summary["resume_command"] == f"python -m sbd_bench run --resume {out}"
    assert "finish it with `python -m sbd_bench run --resume" in (out / "report.md").read_text()
    done = subprocess.run(summary["resume_command"].replace("python", sys.executable, 1).split(), cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    finished = json.loads((out / "summary.json").read_text())
    assert finished["complete"] and finished["samples"]["recorded"] == 16 and finished["resume_command"] is None


def test_ntp_vs_generate_suppresses_the_mask_token(tmp_path):
    """scripts/ntp_vs_generate.py on a model whose argmax is the mask token at the first step: generate
    must not emit it (the core never does), or the script's equality check fails for no fault."""
    import torch
    from tiny_models import build_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_tiny_model(tmp_path / "model", "llama", seed=0, max_positions=128)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    prompt = "1+2="
    with torch.no_grad():
        first = int(model(torch.tensor([tokenizer(prompt)["input_ids"]])).logits[0, -1].argmax())
        model.lm_head.weight[tokenizer.mask_token_id] = 50 * model.lm_head.weight[first]  # beats it wherever it wins
    model.save_pretrained(folder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "ntp_vs_generate.py"), "--model", str(folder),
                           "--tokens", "24", "--repeats", "1", "--prompt", prompt], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["tokens"] == 24


# ------------------------------------------------------------------------------------------------
# The new flags of run/throughput/compare/report/list tried from outside (an audit): edge values refused
# in one line before any model loads, files given where folders are wanted, outputs that are devices or
# pipes, a closed stdout and a full disk that lose nothing computed.
@pytest.fixture(scope="module")
def audit(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("audit")
    paths = {"root": root}
    paths["fifo"] = root / "fifo"
    os.mkfifo(paths["fifo"])  # an output path that blocks whoever opens it for reading
    paths["run"] = crafted_run(root / "run", standard_records(n=2))
    paths["a_file"] = root / "a_file.txt"
    paths["a_file"].write_text("not a folder\n")
    return paths


BROKEN = "--model {broken_model}"  # a model that cannot load: a refusal must come before it
AUDIT = {
    "--temperature too small to divide by": (f"run {BROKEN} --temperature 1e-45",
                                             "--temperature must be 0 or at least 1e-06 (got 1e-45)"),
    "a spec's temperature too small": (f"run {BROKEN} --solver ntp:temperature=1e-300",
                                       "ntp: temperature must be 0 or at least 1e-06 (got 1e-300)"),
    "--samples past what a run can hold": (f"run {BROKEN} --task arith --solver ntp --samples 99999999999999999999",
                                           "--samples 99999999999999999999 plans"),
    "--repeats past what a run can hold": (f"run {BROKEN} --task arith,reverse --solver ntp+fixed_k:k=1,2,4 --repeats 100000",
                                           "plans 32,000,000 samples (80 examples x 4 configuration(s)"),
    "throughput, two tasks": (f"throughput {BROKEN} --task arith,reverse --out {{root}}/tp.json",
                              "throughput measures one task (got 2: arith, reverse)"),
    "throughput, batch larger than the examples": (f"throughput {BROKEN} --task arith --limit 4 --batch-sizes 1,64 "
                                                   f"--out {{root}}/tp.json", "--batch-sizes 64 is larger than the 4"),
    "compare, a file for the run": ("compare {run} {run}/summary.json",
                                    "{run}/summary.json is a file: give the run folder that holds it: {run}"),
    "report, a file for the run": ("report {run}/samples.jsonl",
                                   "{run}/samples.jsonl is a file: give the run folder that holds it: {run}"),
    "list --plugins a file": ("list --plugins {a_file}", "--plugins {a_file} is a file, not a folder"),
    "--task a device": (f"run {BROKEN} --task /dev/null", "task file /dev/null is not a regular file"),
    "a benchmark's data file a device": (f"run {BROKEN} --task gsm8k:path=/dev/null",
                                         "data file /dev/null is not a regular file"),
}


@pytest.mark.parametrize("case", list(AUDIT))
def test_audit_refused_in_one_line(case, audit, w, tmp_path):
    argv, expected = AUDIT[case]
    names = {k: str(v) for k, v in {**w, **audit}.items()}
    folders = [p for p in audit.values() if p.is_dir() and p != audit["root"]] + [w["broken_model"]]
    before = {p: snapshot(p) for p in folders}
    proc = sbd(*argv.format(**names).split(), cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), proc.stderr[-3000:]
    assert expected.format(**names) in err[0], err[0]
    assert proc.stdout == "", proc.stdout[:300]  # refused before a line of output (`list` printed a header first)
    assert {p: snapshot(p) for p in folders} == before and not list(tmp_path.iterdir())
    assert not (audit["root"] / "tp.json").exists()


@pytest.mark.parametrize("command", ["throughput", "compare"])
def test_an_output_that_is_a_pipe_is_refused_not_read(command, audit, w, tmp_path):
    """--out a FIFO (or /dev/stdout on a pipe): checking whether the file is one's own must not read it,
    which blocks until someone writes; it is refused in one line, as a device is."""
    argv = {"throughput": ["throughput", "--model", w["broken_model"], "--out", audit["fifo"]],
            "compare": ["compare", audit["run"], audit["run"], "--out", audit["fifo"]]}[command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "sbd_bench", *map(str, argv)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert f"--out {audit['fifo']} is not a regular file" in err[0], err[0]


def test_compare_writes_its_out_file_before_stdout(audit, tmp_path):
    """`compare A B --out F | head -0`: the reader is gone before the table; F is written all the same."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "compare.md"
    proc = subprocess.Popen([sys.executable, "-m", "sbd_bench", "compare", str(audit["run"]), str(audit["run"]),
                             "--out", str(out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    assert proc.wait(timeout=120) == 141
    assert out.read_text().startswith("| config | task |")


def limited_file_size(limit: int):
    """preexec_fn: files of this process may not grow past ``limit`` bytes (EFBIG, as on a full disk)."""
    def apply():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_names_the_file_and_leaves_no_temporary_files(audit, tmp_path):
    """A write that runs out of room: one line naming the file, no `.NAME.PID.tmp` left beside it, no
    empty folder, and the command run again once there is room succeeds (a report half written is its own
    to replace). 300 bytes: the first file already fails; 5000: report.md and the CSVs fit, a plot does not."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for argv, written, limit in ((["report", audit["run"], "--out", tmp_path / "rep"], tmp_path / "rep", 300),
                                 (["report", audit["run"], "--out", tmp_path / "rep2"], tmp_path / "rep2", 5000),
                                 (["compare", audit["run"], audit["run"], "--out", tmp_path / "c.md"], tmp_path / "c.md",
                                  300)):
        full = subprocess.run([sys.executable, "-m", "sbd_bench", *map(str, argv)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, preexec_fn=limited_file_size(limit))
        err = full.stderr.strip().splitlines()
        assert full.returncode == 2 and len(err) == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
        assert f"error: cannot write {written}" in err[0] and "File too large" in err[0], err[0]
        assert not [p.name for p in tmp_path.rglob(".*.tmp")]
        assert not written.is_dir() or list(written.iterdir())  # a report folder it made is not left empty
        again = subprocess.run([sys.executable, "-m", "sbd_bench", *map(str, argv)], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr[-3000:]


# ------------------------------------------------------------------------------------------------
# `train` (issues 18 and 20): bad values refused in one line before any model loads, a non-finite
# loss stops the run keeping its last checkpoint, characters the tokenizer cannot encode are counted,
# a closed pipe costs no work, Ctrl-C names the resume command, no transformers progress bar leaks.
TRAIN_TINY = ["--data", "reverse", "--train-examples", "16", "--hidden-size", "32", "--layers", "2", "--heads", "4",
              "--intermediate-size", "64", "--max-positions", "96", "--threads", "1"]
TORCHRUN_ENV = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29699"}


@pytest.fixture(scope="module")
def train_inputs(tmp_path_factory) -> dict:
    from sbd_bench.training.config import TrainConfig
    from sbd_bench.training.train import train

    root = tmp_path_factory.mktemp("train_bad")
    (root / "no_assistant.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    no_peft = root / "no_peft" / "peft"
    no_peft.mkdir(parents=True)
    (no_peft / "__init__.py").write_text("raise ImportError('peft is not installed (hidden by the test)')\n")
    checkpoint = root / "batch2"
    train(TrainConfig(out=str(checkpoint), data="reverse", steps=2, batch_size=2, train_examples=16, hidden_size=32,
                      layers=2, heads=4, intermediate_size=64, max_positions=96, threads=1), log=lambda line: None)
    return {"root": root, "no_assistant": root / "no_assistant.jsonl", "no_peft": no_peft.parent,
            "batch2": checkpoint}


# (argv, what the one line must say, extra environment)
TRAIN_CASES = {
    "train --threads -1": ("--threads -1", "--threads must be >= 1", {}),
    "train --lr inf": ("--lr inf", "--lr must be a finite number > 0 (got inf)", {}),
    "train --lr nan": ("--lr nan", "--lr must be a finite number > 0 (got nan)", {}),
    "train --warmup -5": ("--warmup -5", "--warmup must be >= 0", {}),
    "train --grad-accum 0": ("--grad-accum 0", "--grad-accum must be >= 1", {}),
    "train --stop-at 0": ("--stop-at 0", "--stop-at must be a step in 1..", {}),
    "global batch not divisible by accumulation": ("--global-batch-size 5 --grad-accum 2", "is not divisible by 1 rank(s)", {}),
    "global batch not divisible by the world size": ("--global-batch-size 3", "is not divisible by 2 rank(s)", TORCHRUN_ENV),
    "--strategy fsdp without torchrun": ("--strategy fsdp", "--strategy fsdp needs torchrun", {}),
    "--strategy single under torchrun": ("--strategy single", "would train 2 identical copies", TORCHRUN_ENV),
    "--lora-rank without peft": ("--lora-rank 4", "--lora-rank needs peft", {"PYTHONPATH": "{no_peft}"}),
    "chat line with no assistant turn": ("--data {no_assistant}", "no_assistant.jsonl:1: no assistant turn", {}),
    "checkpoint of another global batch": ("--resume --out {batch2} --batch-size 2", "global batch of 2", TORCHRUN_ENV),
}


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_train_bad_input_is_one_line_and_writes_nothing(case, train_inputs, tmp_path):
    flags, expected, extra_env = TRAIN_CASES[case]
    names = {k: str(v) for k, v in train_inputs.items()}
    before = snapshot(train_inputs["batch2"])
    argv = ["train", *TRAIN_TINY, *flags.format(**names).split()]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    env = {**os.environ, **{k: v.format(**names) for k, v in extra_env.items()}}
    env["PYTHONPATH"] = os.pathsep.join([*([env["PYTHONPATH"]] if "PYTHONPATH" in extra_env else []), str(ROOT)])
    proc = subprocess.run([sys.executable, "-m", "sbd_bench", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), proc.stderr[-3000:]
    assert expected in err[0], err[0]
    assert not (tmp_path / "out").exists() and snapshot(train_inputs["batch2"]) == before


def train_process(out: Path, *flags: str, cwd: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "sbd_bench", "train", *TRAIN_TINY, "--batch-size", "2", "--out",
                             str(out), *flags],
                            cwd=cwd, env=env, text=True, **{"preexec_fn": sigint_at_default, **popen})


def test_train_stops_at_a_non_finite_loss_keeping_the_last_checkpoint(tmp_path):
    from sbd_bench.training.checkpoint import latest, read_meta

    proc = train_process(tmp_path / "nan", "--lr", "1e30", "--warmup", "0", "--steps", "20", "--save-every", "1",
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=300)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert "training stopped before this update" in errors[0] and "lower --lr" in errors[0]
    step = read_meta(latest(tmp_path / "nan"))["step"]
    assert 1 <= step < 20 and f"the last good checkpoint (step {step})" in errors[0]
    assert f"step {step + 1}: the " in errors[0]  # the very next step's loss (or gradient) was not finite
    assert not (tmp_path / "nan" / "model.safetensors").exists()  # nothing exported from a broken run
    assert "Writing model shards" not in err


def test_train_warns_once_about_characters_the_tokenizer_cannot_encode(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"caf\u00e9 {i}=", "completion": "\u00fc"}, ensure_ascii=False) + "\n"
                            for i in range(3)) + json.dumps({"prompt": "1=", "completion": "1"}) + "\n", encoding="utf-8")
    flags = ["--data", str(data), "--steps", "2"]
    proc = train_process(tmp_path / "o", *flags, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=300)
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert proc.returncode == 0 and len(warnings) == 1, err[-3000:]
    assert "6 token(s) in 3 line(s) (lines 1, 2, 3)" in warnings[0] and "'éü'" in warnings[0]
    assert "Writing model shards" not in err


def test_train_with_a_closed_output_finishes_its_work(tmp_path):
    """`train ... 2>&1 | head -1`: the reader leaves after the first line; the training goes on to the end."""
    proc = train_process(tmp_path / "o", "--steps", "6", "--save-every", "3", "--log-every", "1", cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first = proc.stdout.readline()
    proc.stdout.close()
    assert first.startswith("train:") and proc.wait(timeout=300) in (0, 141)
    assert (tmp_path / "o" / "model.safetensors").is_file()  # trained to the end and exported
    log = [json.loads(line) for line in (tmp_path / "o" / "training_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 6


def test_train_interrupted_says_how_to_resume(tmp_path):
    import shlex
    import signal

    proc = train_process(tmp_path / "o", "--steps", "400", "--save-every", "2", "--log-every", "1", cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in proc.stderr:
        if line.startswith("checkpoint: step 2"):
            proc.send_signal(signal.SIGINT)
            break
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 130 and "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[0].startswith("interrupted: the step-") and "checkpoint is kept in" in lines[0]
    resume = lines[1].strip()
    assert resume.startswith("python -m sbd_bench train") and resume.endswith("--resume") and "--steps 400" in resume
    assert lines[3].strip() == f"python -m sbd_bench train --export --out {tmp_path / 'o'}"
    words = shlex.split(resume)[1:]  # the printed command continues the run
    done = subprocess.run([sys.executable, *words[:-1], "--steps", "400", "--stop-at", "6", "--resume"], cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "stopped after step 6" in done.stderr, done.stderr[-3000:]


# ------------------------------------------------------------------------------------------------
# `train` tried from outside (the audit of issues 18, 20, 22, 23): each mode reads its own options and
# refuses the others by name, edge values, someone's model folder as --export-to, a checkpoint already
# past --steps, a line both chat and prompt/completion: each one line before any model loads. Then a
# full disk while saving a checkpoint, a refusal that needs --base's tokenizer, and torchrun's 2 ranks.
@pytest.fixture(scope="module")
def train_audit(tmp_path_factory, train_inputs) -> dict:
    root = tmp_path_factory.mktemp("train_audit")
    paths = {"root": root, "batch2": train_inputs["batch2"]}
    paths["both"] = root / "both.jsonl"  # a line that is chat and prompt/completion at once
    paths["both"].write_text(json.dumps({"messages": [{"role": "user", "content": "1+1="},
                                                      {"role": "assistant", "content": "2"}],
                                         "prompt": "2+2=", "completion": "4"}) + "\n")
    paths["chat"] = root / "chat.jsonl"  # a good chat line (for a tokenizer without a chat template)
    paths["chat"].write_text(json.dumps({"messages": [{"role": "user", "content": "1+1="},
                                                      {"role": "assistant", "content": "2"}]}) + "\n")
    paths["theirs"] = root / "their_model"  # someone's model folder: an export must not replace it
    paths["theirs"].mkdir()
    (paths["theirs"] / "config.json").write_text('{"model_type": "llama"}\n')
    (paths["theirs"] / "model.safetensors").write_bytes(b"their weights")
    paths["a_file"] = root / "a_file.txt"
    paths["a_file"].write_text("not a folder\n")
    paths["broken_model"] = root / "broken_model"  # a model that cannot load: a refusal must come before it
    paths["broken_model"].mkdir()
    (paths["broken_model"] / "config.json").write_text('{"model_type": "no_such_architecture"}')
    return paths


TRAIN_AUDIT = {
    "--plan --export": ("--plan --export --out {batch2}", "--plan only plans: drop --export, --out"),
    "--export --resume": ("--export --resume --out {batch2}",
                          "--export writes the model of the checkpoint in --out: drop --resume"),
    "--export --steps --lora-rank": ("--export --steps 5 --lora-rank 4 --out {batch2}", "drop --lora-rank, --steps"),
    "--measure-throughput --out": ("--measure-throughput 1 --out {root}/m",
                                   "--measure-throughput measures and saves nothing: drop --out"),
    "--dims without --plan": ("--dims llama-3.1-8b --out {root}/m", "--dims goes with --plan"),
    "--world-size without --plan": ("--world-size 8 --out {root}/m", "--world-size goes with --plan"),
    "--export-to without --export": ("--export-to {root}/e --out {root}/m", "--export-to goes with --export"),
    "--export-to someone's model": ("--export --out {batch2} --export-to {theirs}",
                                    "--export-to {theirs} holds config.json, model.safetensors, which are not an "
                                    "export of sbd_bench's"),
    "--out someone's model, --overwrite": ("--out {theirs} --overwrite",
                                           "--out {theirs} holds config.json, model.safetensors, which are not a "
                                           "train run's"),
    "--export-to a file": ("--export --out {batch2} --export-to {a_file}", "--export-to {a_file} is a file, not a folder"),
    "--export-to /proc": ("--export --out {batch2} --export-to /proc/sbd-export",
                          "cannot write to --export-to /proc/sbd-export"),
    "--resume past --steps": ("--resume --out {batch2} --steps 1 --batch-size 2",
                              "is at step 2, past the end of --steps 1: nothing to train"),
    "--resume at --steps": ("--resume --out {batch2} --steps 2 --batch-size 2",
                            "is at step 2, the end of --steps 2: nothing to train"),
    "--resume, --stop-at before the checkpoint": ("--resume --out {batch2} --steps 5 --stop-at 2 --batch-size 2",
                                                  "--stop-at 2 is not after it"),
    "--grad-accum past int64": ("--grad-accum 99999999999999999999 --out {root}/m",
                                "--grad-accum 99999999999999999999 is out of range"),
    "--global-batch-size 0": ("--global-batch-size 0 --out {root}/m", "--global-batch-size must be >= 1"),
    "--global-batch-size and --batch-size": ("--global-batch-size 8 --batch-size 3 --out {root}/m",
                                             "give --global-batch-size or --batch-size, not both"),
    "--plan --world-size 0": ("--plan --dims llama-3.1-8b --world-size 0", "--world-size must be >= 1"),
    "--plan --gpu-memory inf": ("--plan --dims llama-3.1-8b --gpu-memory inf",
                                "--gpu-memory must be a finite number of GB > 0"),
    "--plan --device tpu": ("--plan --dims llama-3.1-8b --device tpu", "unknown --device 'tpu'"),
    "--plan --lora-rank 0": ("--plan --dims llama-3.1-8b --lora-rank 0", "--lora-rank must be >= 1"),
    "--plan --dims and --base": ("--plan --dims llama-3.1-8b --base {broken_model}", "give --dims or --base, not both"),
    "--plan, a batch the world size does not divide": ("--plan --dims llama-3.1-8b --world-size 3 --global-batch-size 4",
                                                       "is not divisible by 3 rank(s)"),
    "--plan --threads": ("--plan --dims llama-3.1-8b --threads 1", "--plan only plans: drop --threads"),
    "a line both chat and prompt/completion": ("--data {both} --out {root}/m",
                                               "both.jsonl:1: holds both 'messages' and 'prompt'/'completion'"),
}


@pytest.mark.parametrize("case", list(TRAIN_AUDIT))
def test_train_audit_refused_in_one_line(case, train_audit, tmp_path):
    argv, expected = TRAIN_AUDIT[case]
    names = {k: str(v) for k, v in train_audit.items()}
    folders = [p for p in train_audit.values() if p.is_dir() and p != train_audit["root"]]
    before = {p: snapshot(p) for p in folders}
    proc = sbd("train", *argv.format(**names).split(), cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), proc.stderr[-3000:]
    assert expected.format(**names) in err[0], err[0]
    assert {p: snapshot(p) for p in folders} == before and not list(tmp_path.iterdir())
    assert not (train_audit["root"] / "m").exists() and not (train_audit["root"] / "e").exists()


def test_export_to_an_earlier_export_of_the_same_weights_is_allowed(train_audit, tmp_path):
    """--export-to may replace an export whose history (training_stages.jsonl) begins the run's: an
    earlier export of this run, or of its --base; not another run's."""
    from sbd_bench.training.checkpoint import STAGES_FILE, check_export_folder
    from sbd_bench.training.config import TrainError

    run = train_audit["batch2"]
    stages = (run / STAGES_FILE).read_text()
    for name, history in (("earlier", stages), ("base", stages.splitlines(keepends=True)[0]), ("other", "{}\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"weights")
        (tmp_path / name / STAGES_FILE).write_text(history)
    check_export_folder(run, tmp_path / "earlier")
    check_export_folder(run, tmp_path / "base")
    check_export_folder(run, run)  # the run's own folder (the default --export-to)
    check_export_folder(run, tmp_path / "new")
    with pytest.raises(TrainError, match="the export of another training run"):
        check_export_folder(run, tmp_path / "other")


def test_train_out_of_room_for_a_checkpoint_is_one_line(tmp_path):
    """The sharded checkpoint cannot be written (the disk is full): one line, exit 2, no traceback from
    torch.distributed.checkpoint, no checkpoint.tmp left behind, and the earlier checkpoint kept."""
    from sbd_bench.training.checkpoint import latest, read_meta

    first = train_process(tmp_path / "o", "--steps", "2", "--stop-at", "1", cwd=tmp_path, stderr=subprocess.PIPE)
    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err[-3000:]
    # a limit on each file's size (RLIMIT_FSIZE) fails the shards' writes as a full disk does
    proc = train_process(tmp_path / "o", "--steps", "2", "--resume", cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=limited_file_size(20_000))
    _, err = proc.communicate(timeout=300)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert f"cannot write the checkpoint of step 2 in {tmp_path / 'o'}: File too large" in errors[0], errors[0]
    assert "the step-1 checkpoint is kept" in errors[0], errors[0]
    assert not (tmp_path / "o" / "checkpoint.tmp").exists()
    assert read_meta(latest(tmp_path / "o"))["step"] == 1


def test_train_base_refused_for_its_tokenizer_says_one_line(train_audit, tmp_path):
    """--base: a refusal that needs the tokenizer or the config (a chat line and a tokenizer without a chat
    template; a block larger than the model's positions) comes before the weights load: it is the only
    line on stderr (no 'Loading weights' bar)."""
    for flags, expected in ((["--data", train_audit["chat"]], "chat template"),
                            (["--data", "reverse", "--block-size", "200"], "max_position_embeddings=128")):
        proc = sbd("train", "--base", ROOT / "models" / "sbd-tiny", *flags, "--threads", "1", "--out", tmp_path / "o",
                   cwd=tmp_path)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and expected in err[0], proc.stderr[-3000:]
        assert not (tmp_path / "o").exists()


def torchrun(*flags: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "sbd_bench", "train", *flags], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_torchrun_ranks_say_one_line(train_inputs, train_audit, tmp_path):
    """Under torchrun with 2 ranks: a bad data line (read by rank 0 alone) is one `error:` line, with no
    traceback from the rank that waited for it; --plan prints its plan once; --export is written once.
    (torchrun itself then reports the failed rank in its own words.)"""
    bad = torchrun(*TRAIN_TINY[2:], "--data", str(train_audit["both"]), "--out", str(tmp_path / "o"), cwd=tmp_path)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode != 0 and len(errors) == 1 and "holds both 'messages'" in errors[0], bad.stderr[-3000:]
    assert "[rank1]" not in bad.stderr and "[rank0]" not in bad.stderr, bad.stderr[-3000:]
    assert not (tmp_path / "o").exists()
    plan = torchrun("--plan", "--dims", "llama-3.1-8b", cwd=tmp_path)
    assert plan.returncode == 0 and plan.stderr.count("plan: llama-3.1-8b") == 1, plan.stderr[-3000:]
    assert len(plan.stdout.strip().splitlines()) == 1
    export = torchrun("--export", "--out", str(train_inputs["batch2"]), "--export-to", str(tmp_path / "e"), cwd=tmp_path)
    assert export.returncode == 0 and export.stderr.count("exported the step-2 checkpoint") == 1, export.stderr[-3000:]
    assert len(export.stdout.strip().splitlines()) == 1 and (tmp_path / "e" / "model.safetensors").is_file()
