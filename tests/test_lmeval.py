"""lm-evaluation-harness through SBD (runner/lmeval.py, runner/lmeval_cli.py), offline: task YAMLs of our own
(tests/data/lmeval/tasks) over local JSONL files, the shipped sbd-tiny. lm-eval's outputs and scores equal
`run`'s on the same prompts; NFE, stops and batches as `run` records them; log-likelihood tasks through the
NTP path; every bad input one line. Needs the extra (.[lmeval]): skipped without it, failed under CI."""
import glob
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from sbd_bench.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "lmeval"
TASKS = str(DATA / "tasks")
MODEL = str(ROOT / "models" / "sbd-tiny")
SPEC = "entropy_bounded:gamma=0.1"
SOLVER = "entropy_bounded:gamma=0.1,proxy=entropy"  # its label in records
COMPARED = ("output_ids", "output_text", "stop_reason", "tokens", "nfe", "revealed_per_forward", "forwards_per_block",
            "prompt_tokens", "prompt_hash", "prompt", "correct", "answer")


def test_main_job_does_not_import_lm_eval():
    """`run`, `list` and every command's parser leave lm-eval (and datasets) unimported."""
    code = ("import sys; from sbd_bench.cli import build_parser, main; import sbd_bench.runner.harness; "
            "build_parser(); assert main(['list']) == 0; "
            "loaded = [m for m in ('lm_eval', 'datasets', 'evaluate', 'sbd_bench.runner.lmeval') if m in sys.modules]; "
            "assert not loaded, loaded")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_without_lm_eval_one_line():
    code = ("import sys; sys.modules['lm_eval'] = None; from sbd_bench.cli import main; "
            "sys.exit(main(['lm-eval', '--tasks', 'gsm8k']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert 'pip install -c constraints.txt -e ".[lmeval]"' in done.stderr


# ------------------------------------------------------------------------------------- with lm-eval
@pytest.fixture(scope="module", autouse=False)
def lm_eval_installed():
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail('CI must run the lm-eval tests: pip install -c constraints.txt -e ".[lmeval]" (.ci/run)')
        pytest.skip("lm-eval is not installed (the .[lmeval] extra)")


@contextmanager
def in_root():
    """data_files in a task YAML resolve against the working directory: the repo root, as documented."""
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(before)


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def both(tmp_path_factory, lm_eval_installed):
    """One `lm-eval` and one `run` over the same examples and prompts, NTP and entropy_bounded."""
    base = tmp_path_factory.mktemp("lmeval")
    with in_root():
        assert main(["lm-eval", "--model", MODEL, "--tasks", "sbd_arith,sbd_arith_comma", "--include-path", TASKS,
                     "--solver", SPEC, "--out", str(base / "lm"), "--threads", "1"]) == 0
        assert main(["run", "--model", MODEL, "--task", f"{DATA / 'arith.jsonl'},{DATA / 'arith_comma.jsonl'}",
                     "--solver", SPEC, "--max-new-tokens", "64", "--out", str(base / "run"), "--threads", "1",
                     "--no-cost-curve", "--trace", "0"]) == 0
    return base / "lm", base / "run"


def paired(both):
    """(lm-eval record, run record) of each configuration and example: lm-eval's doc_id is the line's index."""
    lm_dir, run_dir = both
    ours = {(r["config"], r["task"], r["id"]): r for r in records(run_dir)}
    pairs = []
    for r in records(lm_dir):
        task = r["task"].removeprefix("sbd_")
        pairs.append((r, ours[(r["config"], task, f"test-{r['id']}")]))
    return pairs


def test_outputs_and_scores_equal_runs(both):
    pairs = paired(both)
    assert len(pairs) == 2 * 2 * 6 and {r["config"] for r, _ in pairs} == {"ntp", SOLVER}
    for lm_record, run_record in pairs:
        for field in COMPARED:
            assert lm_record[field] == run_record[field], (field, lm_record["task"], lm_record["id"])
    assert any(not r["correct"] for r, _ in pairs)  # the solver gets one wrong: a score that can differ


def test_lm_eval_results_are_ours(both):
    """lm-eval's own per-sample files (kept untouched in lm_eval/CONFIG/) hold our outputs and our verdicts."""
    lm_dir, _ = both
    by_key = {(r["config"], r["task"], r["id"]): r for r in records(lm_dir)}
    for config, folder in (("ntp", "ntp"), (SOLVER, "entropy_bounded_gamma=0.1_proxy=entropy")):
        results = json.loads(Path(glob.glob(str(lm_dir / "lm_eval" / folder / "results_*.json"))[0]).read_text())
        for task in ("sbd_arith", "sbd_arith_comma"):
            lines = Path(glob.glob(str(lm_dir / "lm_eval" / folder / f"samples_{task}_2*.jsonl"))[0]).read_text()
            samples = [json.loads(line) for line in lines.splitlines()]
            assert len(samples) == 6
            for sample in samples:
                record = by_key[(config, task, str(sample["doc_id"]))]
                assert sample["resps"] == [[record["output_text"]]]
                assert sample["exact_match"] == float(record["correct"])
            accuracy = sum(s["exact_match"] for s in samples) / 6
            assert results["results"][task]["exact_match,none"] == pytest.approx(accuracy)
    summary = json.loads((lm_dir / "summary.json").read_text())
    rows = {(r["config"], r["task"]): r for r in summary["rows"]}
    _, run_dir = both
    for row in json.loads((run_dir / "summary.json").read_text())["rows"]:
        mine = rows[(row["config"], f"sbd_{row['task']}")]
        assert (mine["accuracy"], mine["nfe"], mine["speed_factor_nfe"]) == \
               (row["accuracy"], row["nfe"], row["speed_factor_nfe"])


def test_nfe_per_request_and_until_stops(both):
    lm_dir, _ = both
    recs = records(lm_dir)
    for r in recs:
        assert r["nfe"] >= 1 and sum(r["revealed_per_forward"]) == r["tokens"] and r["batch_size"] == 1
        if r["config"] == "ntp":
            assert r["nfe"] == r["tokens"]  # one forward per token
    full = {r["id"]: r["output_text"] for r in recs if r["task"] == "sbd_arith" and r["config"] == "ntp"}
    for r in (r for r in recs if r["task"] == "sbd_arith_comma"):
        assert r["stop_reason"] == "stop_string" and "," not in r["output_text"]
        if r["config"] == "ntp":  # cut at lm-eval's until=[","], where the text without it has its first comma
            assert r["output_text"] == full[r["id"]].split(",")[0] and r["tokens"] < len(full[r["id"]])


def test_run_folder_is_a_run_folder(both, capsys):
    lm_dir, run_dir = both
    summary = json.loads((lm_dir / "summary.json").read_text())
    assert summary["complete"] and summary["provenance"]["lm_eval"]["version"] == "0.4.13"
    assert summary["provenance"]["lm_eval"]["tasks"] == {"sbd_arith": "generate_until",
                                                         "sbd_arith_comma": "generate_until"}
    assert (lm_dir / "report.html").is_file() and (lm_dir / "report.md").is_file()
    assert main(["report", str(lm_dir)]) == 0
    assert main(["compare", str(lm_dir), str(lm_dir)]) == 0
    capsys.readouterr()


def test_lm_eval_command_line_with_batches(both, tmp_path):
    """lm-eval's own flags (`sbd-lm-eval`, i.e. `python -m sbd_bench.runner.lmeval_cli`), the model found in its
    registry; --batch_size 4 gives batch 1's outputs and NFE, batch 4 recorded; a log-likelihood task beside it
    is scored by NTP and says so."""
    out = tmp_path / "harness"
    done = subprocess.run([sys.executable, "-m", "sbd_bench.runner.lmeval_cli", "--model", "sbd_bench", "--model_args",
                           f"pretrained={MODEL},solver={SPEC},out={out},threads=1", "--tasks", "sbd_arith,sbd_arith_choice",
                           "--include_path", TASKS, "--batch_size", "4"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "solver has no effect on log-likelihood tasks" in done.stderr
    batch1 = {r["id"]: r for r in records(both[0]) if r["config"] == SOLVER and r["task"] == "sbd_arith"}
    mine = records(out)
    assert [r["batch_size"] for r in mine] == [4, 4, 4, 4, 2, 2]
    for r in mine:
        for field in ("output_ids", "output_text", "nfe", "revealed_per_forward", "stop_reason"):
            assert r[field] == batch1[r["id"]][field], field
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["lm_eval"]["loglikelihood_requests"] == {"sbd_arith_choice": 12}
    assert "NTP path" in summary["provenance"]["lm_eval"]["note"]


def test_loglikelihood_is_the_ntp_path(tmp_path, lm_eval_installed, capsys):
    """Each choice's log-likelihood is the sum of NTP's log-probabilities of its tokens (one causal forward, the
    mask token excluded, as NTP decoding reads them) and is_greedy whether each is NTP's argmax; the request is
    split as lm-eval's own models split it (the context's trailing whitespace moves into the continuation)."""
    import torch

    from sbd_bench.core.model import load_model
    from sbd_bench.tasks import encode_prompt

    out = tmp_path / "ll"
    with in_root():
        assert main(["lm-eval", "--model", MODEL, "--tasks", "sbd_arith_choice", "--include-path", TASKS,
                     "--out", str(out), "--threads", "1"]) == 0
    capsys.readouterr()
    samples = [json.loads(line) for line in
               Path(glob.glob(str(out / "lm_eval" / "ntp" / "samples_sbd_arith_choice_*.jsonl"))[0]).read_text().splitlines()]
    lm = load_model(MODEL)
    docs = [json.loads(line) for line in (DATA / "arith_choice.jsonl").read_text().splitlines()]
    for sample in samples:
        doc = docs[sample["doc_id"]]
        for choice, resp in zip(doc["choices"], sample["resps"]):
            context = doc["prompt"].rstrip()  # "642+890=", and "\n" + choice is scored after it
            context_ids = encode_prompt(lm.tokenizer, context)
            whole = encode_prompt(lm.tokenizer, doc["prompt"] + choice)
            with torch.no_grad():
                logits = lm.model(torch.tensor([whole[:-1]])).logits[0].float()
            logits[:, lm.mask_token_id] = float("-inf")
            log_probs = torch.log_softmax(logits, -1)[len(context_ids) - 1:]
            target = torch.tensor(whole[len(context_ids):])
            score, is_greedy = resp[0]  # lm-eval's samples file writes them as strings
            assert float(score) == pytest.approx(float(log_probs.gather(-1, target[:, None]).sum()), abs=1e-4)
            assert is_greedy == str(bool((log_probs.argmax(-1) == target).all()))
        assert sample["acc"] == 1.0  # the right sum is the likelier choice every time
    summary = json.loads((out / "summary.json").read_text())  # no generation records, and the summary says why
    assert summary["rows"] == [] and summary["provenance"]["lm_eval"]["loglikelihood_requests"] == {"sbd_arith_choice": 12}
    assert "solver has no effect" in summary["provenance"]["lm_eval"]["note"]


def test_gsm8k_config_over_a_local_copy(tmp_path, lm_eval_installed, capsys):
    """lm-eval's own gsm8k.yaml (prompt, until, filters, metric) through `include:`, reading a local JSONL copy
    (docs/lm-eval.md): it runs offline and its records carry lm-eval's verdict under gsm8k's first filter."""
    import lm_eval

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gsm8k_local.yaml").write_text(
        f"include: {Path(lm_eval.__file__).parent / 'tasks' / 'gsm8k' / 'gsm8k.yaml'}\n"
        "task: gsm8k_local\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    train: {DATA.parent / 'gsm8k_sample.jsonl'}\n"
        f"    test: {DATA.parent / 'gsm8k_sample.jsonl'}\n")
    out = tmp_path / "gsm8k"
    assert main(["lm-eval", "--model", MODEL, "--tasks", "gsm8k_local", "--include-path", str(tasks), "--num-fewshot",
                 "0", "--out", str(out), "--threads", "1"]) == 0
    capsys.readouterr()
    recs = records(out)
    assert len(recs) == 3 and all(r["prompt"].startswith("Question: ") and r["prompt"].endswith("\nAnswer:") for r in recs)
    assert all(r["score_detail"]["lm_eval"]["metric"] == "exact_match" and r["correct"] is not None for r in recs)
    assert {r["score_detail"]["lm_eval"]["filter"] for r in recs} == {"strict-match"}


# ----------------------------------------------------------------------------------------- bad input
def one_line_error(capsys, argv) -> str:
    with in_root():
        status = main(argv)
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1] if err else ""
    assert status == 2, err[-2000:]
    assert last.startswith("error: ") and err.count("error: ") == 1 and "Traceback" not in err, err[-2000:]
    return last


@pytest.mark.parametrize("argv, says", [
    (["--tasks", "sbd_arith_coma"], "knows no task 'sbd_arith_coma' (did you mean sbd_arith_comma"),
    (["--tasks", "sbd_missing_data"], "no_such_file.jsonl"),
    (["--tasks", "sbd_hub"], "reads a dataset from the Hugging Face Hub"),
    (["--tasks", "sbd_arith", "--solver", "entropy_bounded:gama=0.1"], "gama"),
    (["--tasks", "sbd_arith_choice", "--solver", "entropy_bounded"], "drop --solver or give --solver ntp"),
])
def test_bad_input_is_one_line(argv, says, tmp_path, capsys, lm_eval_installed):
    out = tmp_path / "out"
    err = one_line_error(capsys, ["lm-eval", "--model", MODEL, "--include-path", TASKS, "--out", str(out), *argv])
    assert says in err, err
    assert not out.exists()  # refused before anything was written


def test_bad_model_argument_is_one_line(lm_eval_installed):
    """lm-eval's --batch_size auto reaches the model as a string: refused naming the fix (harness_main prints a
    UsageError as one line, exit status 2)."""
    from sbd_bench.runner.lmeval import SBDLM
    from sbd_bench.types import UsageError

    with pytest.raises(UsageError, match="batch_size=auto must be an integer .* give --batch_size N"):
        SBDLM.create_from_arg_string(f"pretrained={MODEL},solver=ntp", {"batch_size": "auto"})
    with pytest.raises(UsageError, match="names 2 configurations"):
        SBDLM.create_from_arg_string(f"pretrained={MODEL},solver=entropy_bounded+confidence")
    with pytest.raises(UsageError, match="unknown to sbd_bench"):
        SBDLM.create_from_arg_string(f"pretrained={MODEL},temprature=0.5")
    with pytest.raises(UsageError, match="exact=ture must be true or false"):
        SBDLM.create_from_arg_string(f"pretrained={MODEL},exact=ture")


def test_out_folder_with_records_is_refused(both, lm_eval_installed):
    """A run folder is never overwritten by the model's out= (its records would be replaced)."""
    from sbd_bench.runner.lmeval import SBDLM
    from sbd_bench.types import UsageError

    before = (both[0] / "samples.jsonl").read_bytes()
    with pytest.raises(UsageError, match="already holds records"):
        SBDLM.create_from_arg_string(f"pretrained={MODEL},out={both[0]}")
    assert (both[0] / "samples.jsonl").read_bytes() == before
