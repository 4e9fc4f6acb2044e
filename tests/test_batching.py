"""Batched decoding equals batch 1: greedy outputs, NFE and per-forward reveals, for every built-in
solver, with prompts of different lengths and rows that stop at different times and for different
reasons (stop token, stop string, budget, end of context)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from scale_models import build_scale_model as build_tiny_model
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry

PROMPTS = ["1+2=", "12*3=", "abc", "9", "44+55-3=", "hij*hij*hij*hij*hij*hij*hij*hij*hij=", "c"]
FIELDS = ("output_ids", "output_text", "stop_reason", "nfe", "prefill_forwards", "revealed_per_forward",
          "forwards_per_block", "remasked_per_block", "forced_per_block")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("llama"), max_positions=48)
    model = load_model(path, device="cpu", dtype="float32")
    dash = model.tokenizer.convert_tokens_to_ids("-")
    # '-' is a stop token too: this random model emits it at varied points, so rows stop at different times
    return dataclasses.replace(model, stop_token_ids=(*model.stop_token_ids, dash))


def _solvers():
    extra = "+fixed_k:k=3+entropy_bounded:gamma=0,1.5+random_order:n=1,3+left_to_right:n=2"
    return parse_solver_spec("all" + extra, solver_registry())


def _records(gens):
    return [{f: getattr(g, f) for f in FIELDS} for g in gens]


@pytest.mark.parametrize("stop_strings", [(), ("dd",)], ids=["stop-token", "stop-string"])
def test_batch_equals_batch_one_for_every_solver(lm, stop_strings):
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    reasons = set()
    for solver in _solvers():
        decoder = Decoder(lm, block_size=4, max_new_tokens=14, stop_strings=stop_strings, seed=3)
        reference = _records(decoder.generate(p, solver) for p in prompts)
        reasons |= {r["stop_reason"] for r in reference}
        for batch_size in (3, len(prompts)):
            batched = []
            for i in range(0, len(prompts), batch_size):
                batched += _records(decoder.generate_batch(prompts[i : i + batch_size], solver))
            assert batched == reference, f"{solver.label} at batch {batch_size}"
    # the cases the comparison must cover did occur
    assert {"max_new_tokens", "context"} <= reasons
    assert ("stop_string" if stop_strings else "stop_token") in reasons


def test_rows_stop_at_different_times(lm):
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    solver = parse_solver_spec("entropy_bounded", solver_registry())[0]
    gens = Decoder(lm, block_size=4, max_new_tokens=14).generate_batch(prompts, solver)
    assert len({g.tokens for g in gens}) >= 3
    assert len({g.nfe for g in gens}) >= 3


# ------------------------------------------------------------------------------ through the harness
TIMING = ("wall_time_s", "prefill_time_s", "decode_time_s", "peak_memory_bytes", "peak_memory_source", "memory",
          "batch_size")


def _task_file(path):
    import json

    with open(path, "w") as handle:
        for i, prompt in enumerate(PROMPTS[:5]):
            handle.write(json.dumps({"id": str(i), "prompt": prompt, "answer": "8"}) + "\n")
    return path


def _run(model_dir, task, out, **overrides):
    from sbd_bench.analysis.records import read_records
    from sbd_bench.runner.harness import RunConfig, run

    cfg = RunConfig(model=str(model_dir), tasks=[str(task)], solvers="all", out=out, block_size=4,
                    max_new_tokens=10, device="cpu", dtype="float32", cost_curve=False, report=False, **overrides)
    run(cfg)
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_records(out / "samples.jsonl")], cfg


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("run-llama"))


def test_run_batch_size_gives_the_batch_one_records(model_dir, tmp_path):
    task = _task_file(tmp_path / "mini.jsonl")
    one, _ = _run(model_dir, task, tmp_path / "b1", repeats=2)
    three, _ = _run(model_dir, task, tmp_path / "b3", batch_size=3, repeats=2)
    assert len(one) == 2 * 5 * len(parse_solver_spec("all", solver_registry()))
    assert three == one  # same records, in the same order


def test_out_of_memory_halves_the_batch_and_goes_on(model_dir, tmp_path, monkeypatch, capsys):
    original = Decoder.generate_batch

    def small_memory(self, prompts, solver, *args, **kwargs):  # a device that holds at most 2 sequences at once
        if len(prompts) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, prompts, solver, *args, **kwargs)

    monkeypatch.setattr(Decoder, "generate_batch", small_memory)
    task = _task_file(tmp_path / "mini.jsonl")
    records, _ = _run(model_dir, task, tmp_path / "oom", batch_size=5)
    assert "batch size 5 does not fit in memory; decoding 2 at a time instead" in capsys.readouterr().err
    monkeypatch.undo()
    reference, _ = _run(model_dir, task, tmp_path / "ref")
    assert records == reference


def test_one_sequence_that_does_not_fit_is_a_clear_error():
    from sbd_bench.runner.batches import BatchSizeError, FittingBatcher

    def never_fits(part):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory")

    with pytest.raises(BatchSizeError, match="one sequence alone does not fit"):
        FittingBatcher(4).run(never_fits, [1, 2, 3])
    with pytest.raises(ValueError, match="unrelated"):  # other errors are not mistaken for memory
        FittingBatcher(4).run(lambda part: (_ for _ in ()).throw(ValueError("unrelated")), [1])


def test_device_map_auto_loads_and_decodes_like_one_device(model_dir, tmp_path):
    pytest.importorskip("accelerate")
    task = _task_file(tmp_path / "mini.jsonl")
    one, _ = _run(model_dir, task, tmp_path / "plain")
    mapped, _ = _run(model_dir, task, tmp_path / "mapped", device_map="auto")
    assert mapped == one
    summary = json.loads((tmp_path / "mapped" / "summary.json").read_text())
    assert summary["provenance"]["model_info"]["device_map"] == {"": "cpu"}


def test_throughput_sweep_reports_what_does_not_fit_and_goes_on(lm, monkeypatch, capsys):
    from sbd_bench.runner.harness import RunConfig
    from sbd_bench.runner.throughput import sweep
    from sbd_bench.types import Task

    original = Decoder.generate_batch

    def small_memory(self, prompts, solver):  # at most 2 sequences fit
        if len(prompts) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return original(self, prompts, solver)

    monkeypatch.setattr(Decoder, "generate_batch", small_memory)
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS[:4]]
    solvers = parse_solver_spec("ntp+fixed_k", solver_registry())
    rows = sweep(lm, Task(), prompts, solvers, [1, 2, 3, 4], RunConfig(block_size=4, max_new_tokens=8),
                 report=lambda line: print(line))
    by = {(r["config"], r["batch_size"]): r for r in rows}
    for config in ("ntp", "fixed_k:k=2"):
        assert by[(config, 2)]["outputs_match_batch_1"] is True and by[(config, 2)]["tokens_per_s"] > 0
        assert by[(config, 3)]["error"] == "out of memory" and by[(config, 3)]["largest_batch_size_that_fit"] == 2
        assert by[(config, 4)]["error"].startswith("skipped")
    assert by[("fixed_k:k=2", 1)]["speed_vs_ntp"] is not None
    assert "batch size 3 does not fit in memory; the largest size that fit was 2" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--fast", "--device-map", "auto"], "--fast cannot be combined with --device-map"),
])
def test_bad_scale_flags_are_one_line_errors(model_dir, tmp_path, capsys, args, message):
    from sbd_bench.cli import main

    code = main(["run", "--model", str(model_dir), "--task", str(_task_file(tmp_path / "t.jsonl")),
                 "--out", str(tmp_path / "run"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]


def test_throughput_command_writes_its_figures(model_dir, tmp_path, capsys):
    from sbd_bench.cli import main

    out = tmp_path / "throughput.json"
    code = main(["throughput", "--model", str(model_dir), "--task", str(_task_file(tmp_path / "t.jsonl")),
                 "--solver", "fixed_k", "--batch-sizes", "1,3", "--limit", "4", "--block-size", "4",
                 "--max-new-tokens", "6", "--device", "cpu", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert [(r["config"], r["batch_size"]) for r in result["rows"]] == [("ntp", 1), ("ntp", 3), ("fixed_k:k=2", 1),
                                                                       ("fixed_k:k=2", 3)]
    assert all(r["outputs_match_batch_1"] and r["tokens_per_s"] > 0 for r in result["rows"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["errors"] == 0
    assert main(["throughput", "--model", str(model_dir), "--batch-sizes", "0,2"]) == 2  # bad input: one line


def test_batch_one_and_batched_refuse_the_same_prompts(lm):
    """Both loops check prompts with ``Decoder.check_prompt``: empty, or filling the model's context (48)."""
    from sbd_bench.core.decoding import DecodeError

    decoder, solver = Decoder(lm, block_size=4, max_new_tokens=4), parse_solver_spec("ntp", solver_registry())[0]
    for prompt, message in (([], "empty prompt"), ([5] * 48, "does not fit the model's context of 48")):
        with pytest.raises(DecodeError, match=message):
            decoder.generate(prompt, solver)
        with pytest.raises(DecodeError, match=message):
            decoder.generate_batch([[5, 6], prompt], solver)
    assert decoder.generate([5] * 47, solver).stop_reason == "context"  # one token short of the context decodes
