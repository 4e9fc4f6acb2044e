"""`compare` passes on an identical run, fails on a planted regression, and reports what it cannot compare."""
import copy
import json

import pytest

from measure_fixtures import crafted_run, standard_records
from sbd_bench.cli import main

EB = "entropy_bounded:gamma=0.35,proxy=entropy"


@pytest.fixture
def baseline(tmp_path):
    return crafted_run(tmp_path / "baseline", standard_records())


def run_with(tmp_path, change=None, records=None):
    records = copy.deepcopy(records if records is not None else standard_records())
    if change:
        change(records)
    return crafted_run(tmp_path / "run", records)


def compare(capsys, *argv) -> tuple[int, str, str]:
    code = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def pick(records, config, task="arith", id="2"):
    return next(r for r in records if r["config"] == config and r["task"] == task and r["id"] == id)


def test_identical_run_passes(baseline, tmp_path, capsys):
    code, out, _ = compare(capsys, baseline, run_with(tmp_path))
    assert code == 0
    assert json.loads(out.strip().splitlines()[-1]) == {"status": "pass", "regressions": 0, "compared": 6,
                                                         "aup_compared": 6, "aup_dropped": 0}


def test_planted_nfe_regression_fails(baseline, tmp_path, capsys):
    def slower(records):
        pick(records, EB)["nfe"] += 1

    code, out, err = compare(capsys, baseline, run_with(tmp_path, slower))
    assert code == 1 and "FAIL" in out and f"REGRESSION: {EB} on arith: nfe" in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "fail"
    assert compare(capsys, baseline, tmp_path / "run", "--nfe-tol", "0.5", "--tpf-tol", "0.5")[0] == 0


def test_accuracy_change_fails(baseline, tmp_path, capsys):
    def wrong(records):
        pick(records, "ntp")["correct"] = False

    code, _, err = compare(capsys, baseline, run_with(tmp_path, wrong))
    assert code == 1 and "ntp on arith: accuracy" in err
    assert compare(capsys, baseline, tmp_path / "run", "--accuracy-tol", "0.25")[0] == 0


def test_wall_clock_tolerance(baseline, tmp_path, capsys):
    def slow_solver(records):
        for r in records:
            if r["config"] == EB:
                r["decode_time_s"] *= 1.5  # speed factor falls by a third

    run = run_with(tmp_path, slow_solver)
    code, _, err = compare(capsys, baseline, run)
    assert code == 1 and "speed_factor_wall" in err
    assert compare(capsys, baseline, run, "--wall-tol", "0.5")[0] == 0


def test_short_run_compares_shared_examples_only(baseline, tmp_path, capsys):
    short = [r for r in standard_records() if r["task"] == "arith" and int(r["id"]) < 2]
    code, out, err = compare(capsys, baseline, run_with(tmp_path, records=short))
    assert code == 0, err
    assert "not in this run" in err  # the copy task of the baseline is noted, not failed


def test_baseline_missing_a_solver_is_reported(tmp_path, capsys):
    base = crafted_run(tmp_path / "baseline", [r for r in standard_records() if r["config"] != "fixed_k:k=4"])
    code, out, err = compare(capsys, base, run_with(tmp_path))
    assert code == 1 and "MISSING IN BASELINE" in out
    assert "fixed_k:k=4 on arith: missing from the baseline" in err and "Traceback" not in err


def test_more_errors_fail(baseline, tmp_path, capsys):
    def crash(records):
        r = pick(records, "fixed_k:k=4")
        r.update(error="OutOfMemoryError: planted", nfe=0, tokens=0, correct=None)

    code, _, err = compare(capsys, baseline, run_with(tmp_path, crash))
    assert code == 1 and "errors 0 -> 1" in err


def test_bad_input_is_one_line(baseline, tmp_path, capsys):
    other = crafted_run(tmp_path / "other", [dict(r, task="elsewhere") for r in standard_records(n=1)])
    code, out, err = compare(capsys, baseline, other)
    assert code == 2 and err.count("\n") == 1 and "share no example" in err
    code, _, err = compare(capsys, baseline, tmp_path / "missing")
    assert code == 2 and err.count("\n") == 1
    code, _, err = compare(capsys, baseline, baseline, "--wall-tol", "-1")
    assert code == 2 and "--wall-tol must be a number >= 0" in err


def test_changed_prompts_cannot_be_compared(tmp_path, capsys):
    records = standard_records()
    for r in records:
        r["prompt_hash"] = f"h{r['task']}{r['id']}"
    base = crafted_run(tmp_path / "baseline", records)

    def new_prompt(recs):
        for r in recs:
            if (r["task"], r["id"]) == ("copy", "3"):
                r["prompt_hash"] = "other"

    code, _, err = compare(capsys, base, run_with(tmp_path, new_prompt, records=records))
    assert code == 2 and "1 shared example(s) have different prompts" in err and "copy/3" in err


def test_markdown_summary_lists_regressions_then_improvements_then_unchanged(baseline, tmp_path, capsys):
    def changed(records):
        pick(records, EB)["nfe"] += 1  # a regression of EB on arith
        for r in records:
            if r["config"] == "fixed_k:k=4" and r["task"] == "copy":
                r["decode_time_s"] /= 2  # twice as fast: an improvement beyond --wall-tol
            if r["config"] == "fixed_k:k=4" and r["task"] == "arith" and r["id"] == "1":
                r["correct"] = True  # 2 more correct within --accuracy-tol 0.25: an improvement too

    run = run_with(tmp_path, changed)
    out = tmp_path / "summary.md"
    code, stdout, err = compare(capsys, baseline, run, "--format", "markdown", "--out", out, "--accuracy-tol", "0.25")
    assert code == 1 and f"REGRESSION: {EB} on arith: nfe" in err  # exit status and stderr as with the table
    assert json.loads(stdout.strip().splitlines()[-1]) == {"status": "fail", "regressions": 2, "compared": 6,
                                                            "aup_compared": 6, "aup_dropped": 0}  # nfe, tok/fwd
    text = out.read_text()
    assert text == stdout[:stdout.rindex("\n{")].rstrip("\n") + "\n"
    assert text.startswith("## sbd_bench compare: FAIL, 1 row(s) regressed")
    sections = [line for line in text.splitlines() if line.startswith("### ")]
    assert sections == ["### Regressions (1)", "### Improvements (2)", "### Unchanged (3)",
                        "### AUP per solver family (0 dropped)"]
    improvements = text[text.index("### Improvements"):text.index("### Unchanged")]
    assert "| fixed_k:k=4 | copy |" in improvements and "speed_factor_wall" in improvements
    assert "| fixed_k:k=4 | arith |" in improvements and "accuracy 0.6 -> 0.8" in improvements
    assert f"| {EB} | arith |" in text[:text.index("### Improvements")]
    assert "<details>" in text[text.index("### Unchanged"):]
    # the file it wrote may be written again; the same check passes against itself
    assert compare(capsys, baseline, baseline, "--format", "markdown", "--out", out)[0] == 0
    assert out.read_text().startswith("## sbd_bench compare: pass")


def test_aup_drop_beyond_noise_is_reported_beside_nfe_and_accuracy(baseline, tmp_path, capsys):
    def one_wrong(records):
        pick(records, EB)["correct"] = False  # 80% on arith: 20 points below NTP, its point leaves the AUP curve

    run = run_with(tmp_path, one_wrong)
    code, out, err = compare(capsys, baseline, run, "--accuracy-tol", "0.25")
    assert code == 0  # within --accuracy-tol: AUP, made of accuracy and tokens per forward, adds no gate of its own
    line = next(line for line in out.splitlines() if line.startswith("| entropy_bounded | arith |"))
    assert line.endswith("| 100.0 | DROP |")  # AUP run: NTP's point alone
    assert "note: entropy_bounded on arith: AUP 208.3 -> 100.0 (baseline's 95% interval [200.0, 218.2], y_max 100.0), beyond noise" in err
    assert json.loads(out.strip().splitlines()[-1])["aup_dropped"] == 1
    assert "| entropy_bounded | copy |" in out and out.count("| DROP |") == 1  # copy unchanged
    code, out, _ = compare(capsys, baseline, run, "--accuracy-tol", "0.25", "--format", "markdown")
    assert "### AUP per solver family (1 dropped)" in out and "AUP 208.3 -> 100.0" in out
