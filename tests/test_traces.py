"""traces.jsonl: every forward of a traced sample (docs/records.md). A trace agrees with its record: one
entry per forward, the tokens each committed are the record's revealed_per_forward, the output rebuilt from
the trace is the record's, a verified configuration's accepted drafts add up to its accepted counts, a
revoking one's masked-again slots to its remasked counts; which samples are traced, resuming, and --trace's
bad values."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sbd_bench.analysis.metrics import sample_key
from sbd_bench.analysis.records import read_records
from sbd_bench.analysis.traces import read_traces, trace_key, trace_problems
from sbd_bench.runner.harness import RunConfig, run
from sbd_bench.tasks import expand_tasks

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent
SPEC = ("ntp+entropy_bounded+entropy_bounded:verify=on+fixed_k:k=16;verify=on+wino:tau_in=0.3;tau_out=1"
        "+wino:tau_in=0.3;tau_out=1;verify=on+klass")


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("traced") / "run"
    run(RunConfig(model="sbd-tiny", tasks=expand_tasks("suite"), solvers=SPEC, out=out, limit=2, device="cpu",
                  dtype="float32", cost_curve=False, report=False, threads=1, trace=None))
    return out


def rebuilt_output(trace: dict) -> list[int] | None:
    """The output as the blocks' tokens tell it (unverified block solvers): each block's tokens as its last
    forward left them, as many as it committed."""
    forwards = trace["forwards"]
    if any(e["kind"] != "block" for e in forwards):
        return None
    by_start: dict[int, list[dict]] = {}
    for entry in forwards:
        by_start.setdefault(entry["start"], []).append(entry)
    return [t for start in sorted(by_start) for t in by_start[start][-1]["tokens"][
        : sum(len(e["committed"]) for e in by_start[start])]]


def test_every_traced_sample_agrees_with_its_record(traced_run):
    records = {sample_key(r): r for r in read_records(traced_run / "samples.jsonl")}
    traces = {trace_key(t): t for t in read_traces(traced_run / "traces.jsonl")}
    assert set(traces) == set(records)  # --trace all: every sample
    seen = {"accepted": 0, "remasked": 0, "verify": 0}
    for key, trace in traces.items():
        rec = records[key]
        forwards = trace["forwards"]
        assert trace["output_ids"] == rec["output_ids"]
        assert trace_problems(trace, rec) == []  # what the report checks: it adds up to its record
        assert [e["n"] for e in forwards] == list(range(1, rec["nfe"] + 1))  # one entry per forward, in order
        assert [t for e in forwards for t in e["committed"]] == rec["output_ids"]  # joined: the output
        for e in forwards:
            assert set(e["revealed"]) <= set(e["masked"]) | ({0} if e["kind"] == "verify" else set())
            assert len(e["tokens"]) == e["size"] == len(e["entropy"]) == len(e["confidence"])
            assert all((e["entropy"][i] is None) == (i not in e["masked"]) for i in range(e["size"]))
            assert all(str(t) in trace["pieces"] for t in e["tokens"] if t >= 0)
        rebuilt = rebuilt_output(trace)
        if rebuilt is not None:
            assert rebuilt == rec["output_ids"], rec["config"]
        if rec.get("accepted_per_block") is not None:  # verified: the verdicts add up to the record's
            verdicts = [e for e in forwards if e["kind"] == "verify"]
            assert sum(e["accepted"] for e in verdicts) == sum(rec["accepted_per_block"])
            assert sum(e["rejected_slot"] is not None for e in verdicts) == sum(rec["replaced_per_block"])
            seen["accepted"] += sum(rec["accepted_per_block"])
            seen["verify"] += 1
        if rec.get("remasked_per_block") is not None:
            assert sum(len(e["revoked"]) for e in forwards) == sum(rec["remasked_per_block"])
            seen["remasked"] += sum(rec["remasked_per_block"])
    assert seen["accepted"] > 0 and seen["verify"] > 0 and seen["remasked"] > 0  # the cases did occur


def test_the_default_traces_the_first_examples_of_each_task_and_resumes(tmp_path):
    out = tmp_path / "run"
    cfg = RunConfig(model="sbd-tiny", tasks=["arith", "tag"], solvers="ntp+entropy_bounded", out=out, limit=3,
                    device="cpu", dtype="float32", cost_curve=False, report=False, threads=1)
    assert cfg.trace == 1  # the default: the first example of each task
    run(cfg)
    traces = {trace_key(t): t for t in read_traces(out / "traces.jsonl")}
    assert {(t, i) for _, t, i, _, _ in traces} == {("arith", "test-0"), ("tag", "test-0")}
    assert len(traces) == 4
    # an interruption after a trace was written but before its record: the resumed run traces it again,
    # and the reader keeps one trace per sample
    lines = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text("\n".join(lines[:2]) + "\n")
    summary = json.loads((out / "summary.json").read_text())
    summary["complete"] = False
    (out / "summary.json").write_text(json.dumps(summary))
    run(cfg, resume=True)
    assert len((out / "traces.jsonl").read_text().splitlines()) > 4
    assert {trace_key(t) for t in read_traces(out / "traces.jsonl")} == traces.keys()
    assert len(read_records(out / "samples.jsonl")) == 12


@pytest.mark.parametrize("value, lines, code", [("0", 0, 0), ("x", None, 2), ("-1", None, 2)])
def test_trace_counts(tmp_path, value, lines, code):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "sbd_bench", "run", "--solver", "ntp", "--task", "arith", "--limit",
                           "2", "--threads", "1", "--no-cost-curve", "--no-report", "--trace", value, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == code, done.stderr[-1000:]
    if code:
        assert "--trace" in done.stderr and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not (out / "samples.jsonl").exists()
    else:
        assert not (out / "traces.jsonl").exists()


def test_the_baselines_decoded_by_generate_are_not_traced(tmp_path):
    """transformers' generate decodes them: the core sees no forward to trace, and the run says nothing wrong."""
    out = tmp_path / "run"
    run(RunConfig(model="sbd-tiny", tasks=["arith"], solvers="ntp+hf_prompt_lookup", out=out, limit=1, device="cpu",
                  dtype="float32", cost_curve=False, report=False, threads=1))
    assert [t["config"] for t in read_traces(out / "traces.jsonl")] == ["ntp"]
    assert len(read_records(out / "samples.jsonl")) == 2
