"""Sampled runs through the runner: N samples of each example, each with its recorded seed (the same for
every configuration), records that --batch-size and --resume reproduce exactly, pass@k in the summary;
greedy runs' records keep exactly their old fields."""
from __future__ import annotations

import json

import pytest

from measure_fixtures import make_task_file
from tiny_models import build_tiny_model
from sbd_bench.analysis import metrics
from sbd_bench.analysis.records import SAMPLES, SUMMARY, read_records
from sbd_bench.runner.harness import RunConfig, resume, run
from sbd_bench.runner.samples import sample_seed
from sbd_bench.types import SAMPLE_FIELDS, SAMPLED_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")

MEASURED = {"wall_time_s", "prefill_time_s", "decode_time_s", "peak_memory_bytes", "peak_memory_source", "memory",
            "batch_size"}
SPEC = "entropy_bounded:verify=on,off+random_order"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sampled")
    return {"model": str(build_tiny_model(folder / "model", seed=1, sharpen=10.0)),
            "task": str(make_task_file(folder / "t.jsonl", n=3))}


def config(setup, out, **changes) -> RunConfig:
    settings = dict(model=setup["model"], tasks=[setup["task"]], solvers=SPEC, out=out, block_size=4,
                    max_new_tokens=8, cost_curve=False, report=False, threads=1, warmup=0, temperature=0.7,
                    top_p=0.9, samples=3)
    return RunConfig(**{**settings, **changes})


def comparable(records):
    return {metrics.sample_key(r): {k: v for k, v in r.items() if k not in MEASURED} for r in records}


@pytest.fixture(scope="module")
def sampled_run(setup, tmp_path_factory):
    return run(config(setup, tmp_path_factory.mktemp("runs") / "a"))


def test_every_sample_has_its_seed_and_the_summary_pass_at_k(sampled_run):
    records = read_records(sampled_run / SAMPLES)
    configs = sorted({r["config"] for r in records})
    assert configs == sorted(["ntp:temperature=0.7,top_p=0.9",
                              "entropy_bounded:gamma=0.35,proxy=entropy,temperature=0.7,top_p=0.9",
                              "entropy_bounded:gamma=0.35,proxy=entropy,verify=on,temperature=0.7,top_p=0.9",
                              "random_order:n=2,temperature=0.7,top_p=0.9"])
    assert len(records) == 4 * 3 * 3
    for r in records:
        assert set(SAMPLE_FIELDS) | set(SAMPLED_FIELDS) <= set(r)
        assert r["seed"] == sample_seed(0, r["task"], r["id"], r["sample"])  # every configuration alike
        assert r["params"]["temperature"] == 0.7 and r["params"]["top_p"] == 0.9
    outputs = {(r["config"], r["id"]): set() for r in records}
    for r in records:
        outputs[(r["config"], r["id"])].add(tuple(r["output_ids"]))
    assert any(len(seen) > 1 for seen in outputs.values())  # samples of one example differ
    rows = json.loads((sampled_run / SUMMARY).read_text())["rows"]
    assert all(row["samples"] == 3 and row["pass_k"] == 3 and row["n"] == 9 for row in rows)
    assert all(row["pass_at_k"] is not None and row["pass_at_k"] >= row["accuracy"] for row in rows)


def test_batches_and_resume_give_the_same_samples(setup, sampled_run, tmp_path):
    expected = comparable(read_records(sampled_run / SAMPLES))
    batched = run(config(setup, tmp_path / "b", batch_size=4))
    assert comparable(read_records(batched / SAMPLES)) == expected
    # an interrupted run (its last records lost) finished by --resume decodes the missing samples alike
    (tmp_path / "c").mkdir()
    lines = (sampled_run / SAMPLES).read_text().splitlines(keepends=True)
    (tmp_path / "c" / SAMPLES).write_text("".join(lines[:-11]))
    summary = json.loads((sampled_run / SUMMARY).read_text())
    summary["complete"] = False
    summary["provenance"]["config"]["out"] = str(tmp_path / "c")
    (tmp_path / "c" / SUMMARY).write_text(json.dumps(summary))
    resumed = resume(tmp_path / "c")
    assert comparable(read_records(resumed / SAMPLES)) == expected


def test_greedy_records_keep_their_fields_and_greedy_samples_differ_only_where_random(setup, tmp_path):
    greedy = read_records(run(config(setup, tmp_path / "g", temperature=0.0, samples=1)) / SAMPLES)
    assert all(not set(SAMPLED_FIELDS) & set(r) for r in greedy)
    assert {r["config"] for r in greedy} == {"ntp", "entropy_bounded:gamma=0.35,proxy=entropy",
                                             "entropy_bounded:gamma=0.35,proxy=entropy,verify=on", "random_order:n=2"}
    several = read_records(run(config(setup, tmp_path / "g3", temperature=0.0, samples=3)) / SAMPLES)
    outputs: dict[tuple, set] = {}
    for r in several:
        assert r["seed"] == sample_seed(0, r["task"], r["id"], r["sample"])
        outputs.setdefault((r["config"], r["id"]), set()).add(tuple(r["output_ids"]))
    assert all(len(seen) == 1 for (config, _), seen in outputs.items() if config != "random_order:n=2")
    assert any(len(seen) > 1 for (config, _), seen in outputs.items() if config == "random_order:n=2")
