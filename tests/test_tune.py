"""`tune` (runner/tune.py, analysis/tuning.py): the split, the losses, the order, certification and the
pick on crafted records; bad inputs refused in one line before anything is decoded; and a real tune on
the shipped model, whose picks `run --solver @TUNE_DIR` runs, interrupted twice and resumed into the
records of an uninterrupted one, nothing decoded twice. The statistics' guarantee: tests/test_ltt.py."""
from __future__ import annotations

import json
import random
import re

import pytest

from measure_fixtures import crafted_record
from sbd_bench.analysis import metrics
from sbd_bench.analysis.ltt import binomial_p_value
from sbd_bench.analysis.records import read_records
from sbd_bench.analysis.tuning import (PARTS, TuneFolderError, add_held_out, certify, config_spec, expand_tuned,
                                       read_tune, setting_rows, split_examples, table_text, write_tune)
from sbd_bench.cli import ProgressBar, main

MEASURED = {"wall_time_s", "prefill_time_s", "decode_time_s", "peak_memory_bytes", "memory"}


# ------------------------------------------------------------------------------------------- the split
def test_the_split_depends_on_the_ids_alone():
    ids = [f"test-{i}" for i in range(100)]
    sizes = {"order": 10, "calibration": 50, "held_out": 30}
    parts = split_examples(ids, "arith", 0, sizes)
    assert [len(parts[p]) for p in PARTS] == [10, 50, 30]
    assert len(set().union(*map(set, parts.values()))) == 90  # disjoint
    assert all(parts[p] == [i for i in ids if i in parts[p]] for p in PARTS)  # in the task's order
    shuffled = random.Random(0).sample(ids, len(ids))
    assert {p: sorted(v) for p, v in split_examples(shuffled, "arith", 0, sizes).items()} == \
        {p: sorted(v) for p, v in parts.items()}
    assert split_examples(ids, "arith", 1, sizes) != parts and split_examples(ids, "tag", 0, sizes) != parts


def test_a_config_spec_parses_back_to_its_configuration():
    from sbd_bench.registry import parse_solver_spec, solver_registry

    registry = solver_registry()
    for spec in ["entropy_bounded:gamma=inf;proxy=margin;verify=on;temperature=0.7;top_k=5", "fixed_k:k=3",
                 "confidence:tau=0.9;verify=on", "ntp"]:
        for solver in parse_solver_spec(spec, registry):
            again = parse_solver_spec(config_spec(solver.name, solver.params), registry)
            assert solver.label in [s.label for s in again]


def test_a_family_is_one_solver_sweeping_one_parameter_core_options_included():
    from sbd_bench.registry import solver_registry
    from sbd_bench.runner.tune import solver_families
    from sbd_bench.types import GREEDY

    registry = solver_registry()
    (verified,) = solver_families("ntp+fixed_k:k=8;verify=off,on", registry, GREEDY)
    assert (verified["family"], verified["swept"], verified["values"]) == ("fixed_k:k=8", "verify", ["off", "on"])
    (sampled,) = solver_families("entropy_bounded:temperature=0,0.7", registry, GREEDY)
    assert sampled["swept"] == "temperature" and sampled["values"] == ["0", "0.7"]
    assert sampled["specs"][1] == "entropy_bounded:gamma=0.35;proxy=entropy;temperature=0.7"


# ----------------------------------------------------------------------------- certifying, on records
FAMILY = {"family": "fam", "solver": "fam", "swept": "x", "configs": ["fam:x=d", "fam:x=c", "fam:x=b", "fam:x=a"],
          "values": ["d", "c", "b", "a"], "specs": ["fam:x=d", "fam:x=c", "fam:x=b", "fam:x=a"]}
NFE = {"a": 10, "b": 5, "c": 2, "d": 1}  # the spec lists them fastest first: the ordering examples reverse it


def crafted_state(ids) -> dict:
    return {"schema_version": 1, "complete": False, "max_loss": 0.2, "delta": 0.2, "tasks": ["t"],
            "sizes": {"order": 5, "calibration": 20, "held_out": 5}, "split_seed": 0,
            "settings": {"command": "crafted"}, "families": [FAMILY],
            "splits": {"t": {"order": ids[:5], "calibration": ids[5:25], "held_out": ids[25:30]}}, "results": None}


def crafted_records(ids, wrong: dict[str, set[int]], ntp_wrong: set[int]) -> list[dict]:
    records = []
    for i, example in enumerate(ids):
        records.append(crafted_record("ntp", "t", example, nfe=20, tokens=20, correct=i not in ntp_wrong,
                                      decode_time_s=0.02))
        for value, nfe in NFE.items():
            records.append(crafted_record(f"fam:x={value}", "t", example, nfe=nfe, tokens=20,
                                          correct=i not in wrong[value], decode_time_s=0.001 * nfe))
    return records


def test_certify_orders_by_the_ordering_examples_stops_at_the_first_failure_and_picks_the_fastest(tmp_path):
    """a (0 losses) and b (1 loss) pass at ε = δ = 0.2 with n = 20; c (10 losses) stops the sequence, so d,
    with no loss at all, is not certified; b is the pick. NTP wrong on example 5 makes c's miss there no
    loss. Then the held-out check, the files, and @TUNE_DIR."""
    ids = [str(i) for i in range(30)]
    wrong = {"a": set(), "b": {7, 26}, "c": set(range(5, 16)), "d": set()}
    records = crafted_records(ids, wrong, ntp_wrong={5})
    state = crafted_state(ids)
    state["results"] = certify(state, records)
    (result,) = state["results"]
    assert [s["value"] for s in result["settings"]] == ["a", "b", "c", "d"]  # most forwards first
    assert [s["losses"] for s in result["settings"]] == [0, 1, 10, 0]  # c's miss on 5: NTP missed it too
    assert [s["p_value"] for s in result["settings"]] == [binomial_p_value(k, 20, 0.2) for k in (0, 1, 10, 0)]
    assert [s["certified"] for s in result["settings"]] == [True, True, False, False]
    assert result["certified"] == 2 and result["pick"] == "fam:x=b" and result["pick_spec"] == "fam:x=b"
    assert result["settings"][1]["speed_factor_nfe"] == pytest.approx(4.0)

    add_held_out(state, {"t": records})
    held = result["held_out"]
    assert (held["n"], held["losses"], held["risk"], held["within_max_loss"]) == (5, 1, 0.2, True)
    assert held["risk_lo"] < 0.2 < held["risk_hi"] and held["speed_factor_nfe"] == pytest.approx(4.0)
    assert held["ntp_accuracy"] == 1.0 and held["accuracy"] == pytest.approx(0.8)

    write_tune(tmp_path, state)
    assert read_tune(tmp_path)["results"][0]["pick"] == "fam:x=b"
    table = (tmp_path / "tune.md").read_text()
    assert "| t | fam | x=b | 2 of 4, p = 0.0692 | 1/20 | 1/5 = 20.0% [" in table
    assert "| solver | t |\n|---|---|\n| fam | x=b: 20.0% / 4.00x |" in table  # side by side
    # testing stopped at c: d, with a p-value that would pass, was never tested, and the table says so
    assert [row[-1] for row in setting_rows(result)[1]] == ["yes", "yes (pick)", "no", "not tested"]
    assert "Tested in the order of mean NFE on" in table
    assert (tmp_path / "tune.png").stat().st_size > 10_000
    assert expand_tuned(f"ntp+@{tmp_path}") == "ntp+fam:x=b"
    assert expand_tuned(f"@{tmp_path}:t") == "fam:x=b"
    with pytest.raises(TuneFolderError, match="tuned no task 'u'"):
        expand_tuned(f"@{tmp_path}:u")

    state["splits"]["t"]["order"] = []  # no ordering examples: the order given in --solver, fastest first here
    (result,) = certify(state, records)
    assert [s["value"] for s in result["settings"]] == ["d", "c", "b", "a"]
    assert result["certified"] == 1 and result["pick"] == "fam:x=d" and result["ordered_by"] == "the order given in --solver"
    state["results"] = [result]
    assert "Tested in the order given in --solver; certified: the first 1" in table_text(state)
    wrong["d"] = {6, 8, 10, 12, 14}  # the first tested fails: nothing is certified, and the table says why
    (result,) = certify(state, crafted_records(ids, wrong, ntp_wrong=set()))
    assert result["pick"] is None and "the first tested, x=d, lost 5 of 20" in result["not_certified"]


def test_a_failed_decode_is_a_loss_and_a_failed_ntp_decode_is_right():
    ids = [str(i) for i in range(30)]
    records = crafted_records(ids, {v: set() for v in NFE}, ntp_wrong=set())
    for r in records:
        if r["id"] == "9" and r["config"] == "fam:x=a":
            r.update(error="RuntimeError: planted", correct=None)
        if r["id"] == "11" and r["solver"] == "ntp":
            r.update(error="RuntimeError: planted", correct=None)
        if r["id"] == "11" and r["config"] == "fam:x=b":
            r["correct"] = False
    state = crafted_state(ids)
    losses = {s["value"]: s["losses"] for s in certify(state, records)[0]["settings"]}
    assert losses == {"a": 1, "b": 1, "c": 0, "d": 0}


# -------------------------------------------------------------------------------------- bad inputs
def one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


EB = "entropy_bounded:gamma=0.1,0.35"
BAD = [
    (["--solver", EB, "--max-loss", "0"], "--max-loss must lie strictly between 0 and 1 (got 0.0)"),
    (["--solver", EB, "--max-loss", "1"], "--max-loss must lie strictly between 0 and 1"),
    (["--solver", EB, "--delta", "0"], "--delta must lie strictly between 0 and 1"),
    (["--solver", EB, "--delta", "1.5"], "--delta must lie strictly between 0 and 1"),
    (["--solver", "entropy_bounded:gamma=0.1"], "at least two settings of entropy_bounded"),
    (["--solver", "ntp,fixed_k"], "at least two settings of fixed_k"),
    (["--solver", "entropy_bounded:gamma=0.1,0.2;proxy=entropy,margin"], "sweeps gamma, proxy"),
    (["--solver", f"{EB}+entropy_bounded:gamma=0.35,1"], "is in two '+'-parts"),
    ([], "tune needs --solver"),
    (["--solver", EB, "--calibration", "100"], "--calibration 114 or more"),
    (["--solver", EB, "--task", "arith"],
     "tune needs 520 examples of task arith (20 to order the settings, 300 to calibrate, 200 held out) and it has "
     "40: draw more with the task option n_test, e.g. --task arith:n_test=520"),
    (["--solver", EB, "--task", "arith:n_test=520,arith:n_test=600"], "names arith twice"),
    (["--solver", EB, "--samples", "2"], "drop --samples"),
    (["--solver", EB, "--held-out", "0"], "--held-out must be >= 1"),
    (["--solver", EB, "--max-loss", "1e-320"], "--max-loss 1e-320 is too small to certify at --delta 0.1: even with "
     "no loss at all it needs ln(delta) / ln(1 - max_loss) = more than 1e308 calibration examples; give --max-loss "
     "1e-08 or more"),
    (["--solver", EB, "--max-loss", "1e-300"], "needs ln(delta) / ln(1 - max_loss) = 2.3e+300 calibration examples"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_input_is_one_line_before_anything_is_decoded(argv, message, tmp_path, capsys):
    out = tmp_path / "tune"
    assert message in one_line_error(["tune", *argv, "--out", str(out)], capsys)
    assert not out.exists()


def test_order_examples_0_warns_that_the_given_order_decides(tmp_path, capsys, monkeypatch):
    import sbd_bench.runner.tune as tune_module

    def stop(*args, **kwargs):  # nothing needs decoding to see the warning
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_module, "_part", stop)
    argv = ["tune", "--task", "tag:n_test=12", "--solver", "fixed_k:k=2,4", "--max-loss", "0.3", "--delta", "0.5",
            "--calibration", "4", "--held-out", "3", "--threads", "1", "--out", str(tmp_path / "t")]
    main([*argv, "--order-examples", "0"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: --order-examples")]
    assert warnings == ["warning: --order-examples 0: each solver's settings are tested in the order given in --solver, "
                        "and that order decides what can be certified: list them from the safest to the most "
                        "aggressive (an aggressive-first list certifies nothing)"]
    main([*argv, "--order-examples", "2", "--out", str(tmp_path / "u")])
    assert "warning: --order-examples" not in capsys.readouterr().err


def test_resume_refusals(tmp_path, capsys):
    assert "holds no tune.json" in one_line_error(["tune", "--resume", str(tmp_path)], capsys)
    assert "drop --max-loss" in one_line_error(["tune", "--resume", str(tmp_path), "--max-loss", "0.1"], capsys)


# --------------------------------------------------------------------------- a tune on the shipped model
# tag with fixed_k fails (revealing a letter and its capital together), EB is right: both branches of
# certification; ε = 0.3, δ = 0.5 certify from 2 examples, so that a few decodes are a whole tune.
TUNE = ["tune", "--task", "tag:n_test=12", "--solver", "entropy_bounded:gamma=0.35,1+fixed_k:k=2,4", "--max-loss",
        "0.3", "--delta", "0.5", "--calibration", "4", "--held-out", "3", "--order-examples", "2", "--threads", "1",
        "--warmup", "0", "--no-cost-curve", "--no-report"]
CALIBRATION_SAMPLES, HELD_OUT_SAMPLES = 6 * 5, 3 * 2


def comparable(records):
    return {metrics.sample_key(r): {k: v for k, v in r.items() if k not in MEASURED} for r in records}


def decided(state):
    """What a tune decided, without its wall-clock figures."""
    return [{**r, "held_out": {k: v for k, v in (r["held_out"] or {}).items() if "wall" not in k}}
            for r in state["results"]]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned") / "tune"
    assert main([*TUNE, "--out", str(out)]) == 0
    return out


def test_a_tune_on_the_shipped_model(tuned, capsys):
    state = read_tune(tuned)
    assert state["complete"] and state["tasks"] == ["tag"] and state["provenance"]["model_path"] == "models/sbd-tiny"
    eb, fixed = state["results"]
    assert eb["pick"] == "entropy_bounded:gamma=0.35,proxy=entropy" and eb["certified"] == 2
    assert eb["held_out"]["losses"] == 0 and eb["held_out"]["speed_factor_nfe"] == pytest.approx(3.0)
    assert fixed["pick"] is None and "the first tested, k=2, lost 4 of 4" in fixed["not_certified"]
    calibration = read_records(tuned / "calibration" / "samples.jsonl")
    assert len(calibration) == CALIBRATION_SAMPLES
    assert {r["id"] for r in calibration} == set(state["splits"]["tag"]["order"] + state["splits"]["tag"]["calibration"])
    held = read_records(tuned / "held_out" / "tag" / "samples.jsonl")
    assert {r["config"] for r in held} == {"ntp", eb["pick"]}
    grid = json.loads((tuned / "calibration" / "summary.json").read_text())["yardsticks"]["aup"]
    [eb_grid] = [e for e in grid if e["family"] == "entropy_bounded"]
    assert len(eb_grid["points"]) == 1 + len(eb["settings"])  # NTP's point and each setting's: one curve
    assert f"| tag | entropy_bounded | {eb_grid['aup']:.1f} [" in (tuned / "tune.md").read_text()
    assert {r["id"] for r in held} == set(state["splits"]["tag"]["held_out"])
    assert main(["tune", "--resume", str(tuned)]) == 0  # complete: nothing decoded, the table and the line again
    captured = capsys.readouterr()
    assert "nothing to resume" in captured.err
    assert re.search(r"\ntag +entropy_bounded:proxy=entropy +gamma=0.35 +2 of 2", captured.err)
    assert json.loads(captured.out.strip().splitlines()[-1]) == {"tune_dir": str(tuned), "complete": True, "picks": 1,
                                                                 "not_certified": 1, "failures": 0}


def test_run_runs_the_picks(tuned, tmp_path, capsys):
    out = tmp_path / "picked"
    assert main(["run", "--task", "tag", "--solver", f"@{tuned}", "--limit", "2", "--threads", "1", "--warmup", "0",
                 "--no-cost-curve", "--no-report", "--out", str(out)]) == 0
    assert {r["config"] for r in read_records(out / "samples.jsonl")} == {"ntp", "entropy_bounded:gamma=0.35,proxy=entropy"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["config"]["solvers"] == "entropy_bounded:gamma=0.35;proxy=entropy"  # resumable alone


class StopAfter(ProgressBar):
    """Ctrl-C after ``n`` recorded samples (each is written before the progress hears of it)."""

    def __init__(self, n: int):
        super().__init__()
        self.left = n

    def update(self, record):
        super().update(record)
        self.left -= 1
        if self.left == 0:
            raise KeyboardInterrupt


def test_interrupted_twice_and_resumed_it_loses_nothing_and_decodes_nothing_twice(tuned, tmp_path, capsys, monkeypatch):
    from sbd_bench.runner.tune import resume_tune

    out = tmp_path / "tune"
    with monkeypatch.context() as patch:  # Ctrl-C in the calibration run, through the command line
        patch.setattr(ProgressBar, "update", lambda self, record: (_ for _ in ()).throw(KeyboardInterrupt))
        assert main([*TUNE, "--out", str(out)]) == 130
    assert f"python -m sbd_bench tune --resume {out}" in capsys.readouterr().err
    first = read_records(out / "calibration" / "samples.jsonl")
    assert len(first) == 1 and read_tune(out)["results"] is None

    with pytest.raises(KeyboardInterrupt):  # then in the held-out run, two samples into it
        resume_tune(out, StopAfter(CALIBRATION_SAMPLES - 1 + 2))
    state = read_tune(out)
    assert not state["complete"] and [r["pick"] for r in state["results"]] == [r["pick"] for r in read_tune(tuned)["results"]]
    second = read_records(out / "held_out" / "tag" / "samples.jsonl")
    assert len(second) == 2

    assert main(["tune", "--resume", str(out)]) == 0
    calibration = read_records(out / "calibration" / "samples.jsonl")
    held = read_records(out / "held_out" / "tag" / "samples.jsonl")
    assert len(calibration) == len({metrics.sample_key(r) for r in calibration}) == CALIBRATION_SAMPLES
    assert len(held) == len({metrics.sample_key(r) for r in held}) == HELD_OUT_SAMPLES
    assert calibration[:1] == first and held[:2] == second  # what was decoded was kept, and not decoded again
    assert comparable(calibration) == comparable(read_records(tuned / "calibration" / "samples.jsonl"))
    assert comparable(held) == comparable(read_records(tuned / "held_out" / "tag" / "samples.jsonl"))
    assert decided(read_tune(out)) == decided(read_tune(tuned)) and read_tune(out)["complete"]
