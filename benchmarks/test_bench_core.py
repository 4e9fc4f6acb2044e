"""Micro-benchmark: the decoding core's per-forward overhead beyond the model call (solver decision,
bookkeeping, stop checks, cache rollback) on a random model with sbd-tiny's dimensions; the overhead
as a fraction of one model call is stored in the benchmark's ``extra_info``.

    tox -e bench            # or: python -m pytest benchmarks -n 0 --benchmark-enable
"""
import pytest

from overhead import TimedModel, measure_overhead, random_lm, random_tiny  # benchmarks/overhead.py


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from sbd_bench.core.model import load_model

    lm = load_model(random_tiny(tmp_path_factory.mktemp("tiny") / "m"), device="cpu")
    lm.stop_token_ids = ()  # decode the whole budget
    return lm


@pytest.mark.parametrize("spec", ["ntp", "entropy_bounded:gamma=0.35", "fixed_k:k=4"])
def test_core_overhead_per_forward(benchmark, lm, spec):
    from sbd_bench.core.decoding import Decoder
    from sbd_bench.registry import parse_solver_spec, solver_registry

    solver = parse_solver_spec(spec, solver_registry())[-1]
    prompt = lm.tokenizer("12+34=", add_special_tokens=True)["input_ids"]
    figures = measure_overhead(lm, solver, prompt, block_size=16, max_new_tokens=48, repeats=3)
    benchmark.extra_info.update(figures)
    decoder = Decoder(lm, block_size=16, max_new_tokens=48)
    gen = benchmark.pedantic(decoder.generate, args=(prompt, solver), rounds=5, iterations=1, warmup_rounds=1)
    assert gen.tokens == 48 and figures["overhead_ms_per_forward"] > 0


def test_timed_model_passes_attributes_through(lm):
    timed = TimedModel(lm.model, lm.device)
    assert timed.config is lm.model.config and timed.times == []


def test_random_model_of_given_dimensions():
    """The path used for Llama-3.1-8B dimensions on a GPU, here with a 128k vocabulary and small layers."""
    from sbd_bench.registry import parse_solver_spec, solver_registry
    from sbd_bench.analysis.roofline import ModelDims

    lm = random_lm(ModelDims(64, 2, 4, 2, 16, 128, 128256), device="cpu")
    solver = parse_solver_spec("entropy_bounded", solver_registry())[-1]
    figures = measure_overhead(lm, solver, [1, 5, 9], block_size=16, max_new_tokens=20, repeats=1)
    assert figures["nfe"] >= 20 and figures["model_ms_per_forward"] > 0  # a last block may take extra forwards
