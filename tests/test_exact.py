"""Exact mode (``--exact``, core/exact.py): a row's logits and keys/values do not depend on the rows
beside it, so verified output = NTP's and batch 4 = batch 1, bit for bit, in bf16 as in fp32, on the
random Llama and Qwen3 of the issue (tests/tiny_models.build_issue_model). Without it, bf16 breaks both
(the tests show the difference first, so that they can fail), and `run` says so in one warning line.
The 1,000-sample version of the verified check is ``scripts/exact_check.py`` (tox -e exact)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.exact import EXACT_ATTENTION, ExactModeError, check_exact
from sbd_bench.core.model import folder_hash, load_model
from sbd_bench.registry import parse_solver_spec, solver_registry
from sbd_bench.runner.samples import RunConfig
from sbd_bench.types import UsageError
from tiny_models import build_issue_model

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")
FIELDS = ("output_ids", "stop_reason", "nfe", "revealed_per_forward", "forwards_per_block", "drafted_per_block",
          "accepted_per_block", "replaced_per_block")
REPRODUCER = "1)= *"  # issue 23: NTP's top two logits one bf16 step apart at token 15 (llama, seed 11, k=3)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def folder(request, tmp_path_factory):
    return build_issue_model(tmp_path_factory.mktemp(request.param), request.param, seed=11)


def _load(folder, dtype, exact):
    lm = load_model(folder, device="cpu", dtype=dtype, exact=exact)
    return dataclasses.replace(lm, stop_token_ids=())  # random models: the budget ends every decode


def _forward_alone_and_together(model, ids: torch.Tensor):
    """(logits, last layer's keys) of one 25-token forward and of 25 one-token forwards."""
    from transformers import DynamicCache

    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        together = DynamicCache(config=model.config)
        logits = model(input_ids=ids, position_ids=positions, cache=together, use_cache=True).logits
        alone = DynamicCache(config=model.config)
        steps = [model(input_ids=ids[:, i : i + 1], position_ids=positions[:, i : i + 1], cache=alone,
                       use_cache=True).logits for i in range(ids.shape[1])]
    return (logits, together.layers[-1].keys), (torch.cat(steps, 1), alone.layers[-1].keys)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_row_is_the_same_whatever_the_rows_beside_it(folder, dtype):
    ids = torch.randint(5, 60, (1, 25), generator=torch.Generator().manual_seed(0))
    (logits, keys), (logits_1, keys_1) = _forward_alone_and_together(_load(folder, dtype, exact=True).model, ids)
    assert torch.equal(keys, keys_1) and torch.equal(logits, logits_1)
    if dtype == "bfloat16":  # what exact mode removes: the plain model's rows depend on the forward's size
        (logits, keys), (logits_1, keys_1) = _forward_alone_and_together(_load(folder, dtype, exact=False).model, ids)
        assert not torch.equal(keys, keys_1) and not torch.equal(logits, logits_1)


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_the_other_supported_families_too(family, tmp_path):
    """exact.SUPPORTED names Qwen2 and Mistral as well (their modeling code is Llama's with biases or a
    window): a random one, saved and loaded like any folder, is row-invariant in bf16."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, vocab_size=80, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    build_issue_model(tmp_path, "llama")  # for its tokenizer files only
    model.save_pretrained(tmp_path)
    ids = torch.randint(5, 60, (1, 25), generator=torch.Generator().manual_seed(0))
    (logits, keys), (logits_1, keys_1) = _forward_alone_and_together(
        load_model(tmp_path, device="cpu", dtype="bfloat16", exact=True, require_mask_token=False).model, ids)
    assert torch.equal(keys, keys_1) and torch.equal(logits, logits_1)


class LogitsRecorder(Decoder):
    """Keeps the logits of every decode forward (B, keep, V)."""

    def forward(self, ids, positions, pattern, cache, phase="decode", keep=0, rows=None, log=None):
        logits = super().forward(ids, positions, pattern, cache, phase, keep, rows, log)
        if phase != "prefill":
            self.seen.append(logits.clone())
        return logits


def test_logits_at_batch_four_equal_batch_one_bitwise(folder):
    """fixed_k:k=1 fills a block of 4 in exactly 4 forwards for every row: the batch moves in lockstep, so
    forward j of row b at batch 4 is forward j of prompt b alone (prompts of different lengths: padding).
    With --exact they are equal over the reference cache and the static one (--fast), and the static
    cache's equal the reference cache's. bf16 without --exact shows what is at stake, over the reference
    cache, whose width grows with the padding (the static cache is as wide at batch 1 as at 4, and its
    bf16 rounding happened to agree here)."""
    solver = parse_solver_spec("fixed_k:k=1", solver_registry())[1]
    for exact, dtype in ((True, "bfloat16"), (True, "float32"), (False, "bfloat16")):
        lm = _load(folder, dtype, exact)
        prompts = [lm.tokenizer(p)["input_ids"] for p in (REPRODUCER, "ab", "12*3=44+5", "q")]
        by_cache = {}
        for fast in ((False, True) if exact else (False,)):
            alone = []
            for prompt in prompts:
                decoder = LogitsRecorder(lm, block_size=4, max_new_tokens=12, fast=fast)
                decoder.seen = []
                decoder.generate(prompt, solver)
                alone.append(decoder.seen)
            decoder = LogitsRecorder(lm, block_size=4, max_new_tokens=12, fast=fast)
            decoder.seen = []
            decoder.generate_batch(prompts, solver)
            assert len(decoder.seen) == len(alone[0]) == 12
            same = all(torch.equal(together[b], alone[b][j][0]) for j, together in enumerate(decoder.seen)
                       for b in range(len(prompts)))
            assert same == exact, (exact, dtype, fast)
            by_cache[fast] = decoder.seen
        if exact:
            assert all(torch.equal(a, b) for a, b in zip(by_cache[False], by_cache[True])), dtype


VERIFIED = "fixed_k:k=16;verify=on+entropy_bounded:gamma=0.35;verify=on+left_to_right:verify=on"
UNVERIFIED = "entropy_bounded:gamma=0.35+confidence"
PROMPTS = [REPRODUCER, "a", "Zz9(", "q;[x/", "7+7=", "hello wor"]


def test_exact_verified_is_ntp_and_batch_four_is_batch_one_in_bf16(folder):
    """The CI-sized check of scripts/exact_check.py: every verified sample equals NTP's, every sample of
    every configuration (unverified entropy ordering included) equals batch 1's at batch 4."""
    lm = _load(folder, "bfloat16", exact=True)
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    solvers = parse_solver_spec(f"{VERIFIED}+{UNVERIFIED}", solver_registry())

    def decoder():
        return Decoder(lm, block_size=3, max_new_tokens=24)  # the reproducer departs at token 15

    ntp = [decoder().generate(p, solvers[0]).output_ids for p in prompts]
    compared = 0
    for solver in solvers:
        one = [decoder().generate(p, solver) for p in prompts]
        four = [g for i in range(0, len(prompts), 4) for g in decoder().generate_batch(prompts[i : i + 4], solver)]
        assert [{f: getattr(g, f) for f in FIELDS} for g in four] == [{f: getattr(g, f) for f in FIELDS} for g in one]
        if solver.verify:
            assert [g.output_ids for g in one] == ntp, solver.label
            compared += len(one)
    assert compared == 3 * len(PROMPTS)


# ------------------------------------------------------------------------------ through `run`
def _run(tmp_path, model, *flags) -> tuple[subprocess.CompletedProcess, list[dict]]:
    task = tmp_path / "p2.jsonl"
    task.write_text(json.dumps({"id": "p2", "prompt": REPRODUCER}) + "\n")
    out = tmp_path / ("exact" if "--exact" in flags else "plain")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "sbd_bench", "run", "--model", str(model), "--task", str(task),
                           "--solver", "ntp+fixed_k:k=16;verify=on", "--dtype", "bfloat16", "--block-size", "3",
                           "--max-new-tokens", "33", "--threads", "1", "--out", str(out), "--no-cost-curve",
                           "--no-report", *flags], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()] if out.is_dir() else []
    return proc, records


def test_the_issue_reproducer_warns_without_exact_and_matches_with_it(tmp_path):
    model = build_issue_model(tmp_path / "llama-s11", "llama", seed=11)
    proc, records = _run(tmp_path, model)
    assert proc.returncode == 0, proc.stderr
    assert records[0]["output_ids"] != records[1]["output_ids"]  # the bf16 departure the issue found
    assert not any("exact" in r for r in records)  # plain records are what they were before exact mode
    table = [line for line in proc.stderr.splitlines() if line.startswith(("task ", "p2 "))]
    column = table[0].index("= NTP %")
    assert [line[column : column + 7].strip() for line in table[1:]] == ["-", "0.0"]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "1 of 1 verified samples" in warnings[0] and "--exact" in warnings[0]

    proc, records = _run(tmp_path, model, "--exact")
    assert proc.returncode == 0, proc.stderr
    assert records[0]["output_ids"] == records[1]["output_ids"] and all(r["exact"] for r in records)
    assert "warning:" not in proc.stderr and " 100.0 " in proc.stderr
    summary = json.loads((tmp_path / "exact" / "summary.json").read_text())
    assert summary["provenance"]["exact"] is True and summary["provenance"]["config"]["exact"] is True
    assert summary["provenance"]["attn_implementation"] == EXACT_ATTENTION


def test_the_folder_stays_a_plain_model(tmp_path):
    folder = build_issue_model(tmp_path / "m", "qwen3", seed=3)
    before = folder_hash(folder)
    exact = load_model(folder, device="cpu", exact=True)
    plain = load_model(folder, device="cpu")
    assert folder_hash(folder) == before and exact.exact and not plain.exact
    assert plain.model.config._attn_implementation == "sdpa"  # the exact load changed nothing shared
    assert [p.data_ptr() for p in exact.model.parameters()] != [] and sum(p.numel() for p in exact.model.parameters()) \
        == sum(p.numel() for p in plain.model.parameters())


# ------------------------------------------------------------------------------- refusals
class Config:
    def __init__(self, model_type="llama", rope_type="default"):
        self.model_type, self.rope_parameters = model_type, {"rope_type": rope_type}


@pytest.mark.parametrize("config, device, message", [
    (Config(), torch.device("cuda"), "CPU only.*batch-invariant kernels.*--device cpu"),
    (Config("gpt2"), torch.device("cpu"), "supports the model families llama, qwen3.*not 'gpt2'"),
    (Config(rope_type="dynamic"), torch.device("cpu"), "rope_type is 'dynamic'"),
])
def test_what_exact_mode_cannot_promise_is_refused(config, device, message):
    with pytest.raises(ExactModeError, match=message):
        check_exact(config, device)


@pytest.mark.parametrize("settings, message", [
    (dict(compile=True), "drop --compile"),
    (dict(attn_implementation="eager"), "drop --attn eager"),
])
def test_settings_that_undo_exact_mode_are_refused(settings, message):
    with pytest.raises(UsageError, match=message):
        RunConfig(exact=True, **settings)


def test_exact_and_plain_records_do_not_mix(tmp_path, capsys):
    """A folder whose run died before its summary is continued by the same command only; compare refuses
    an exact run against a plain baseline."""
    from measure_fixtures import crafted_run, standard_records

    from sbd_bench.cli import main

    plain = crafted_run(tmp_path / "plain", standard_records())
    exact = crafted_run(tmp_path / "exact", standard_records())
    summary = json.loads((exact / "summary.json").read_text())
    summary["provenance"]["exact"] = True
    (exact / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(plain), str(exact)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without --exact" in err[0] and "with --exact" in err[0]


def test_a_folder_of_plain_records_is_not_continued_with_exact(tmp_path):
    from sbd_bench.runner import harness

    model = build_issue_model(tmp_path / "m", "llama", seed=11)
    task = tmp_path / "t.jsonl"
    task.write_text(json.dumps({"id": "a", "prompt": "ab"}) + "\n")
    cfg = dict(model=str(model), tasks=[str(task)], solvers="ntp", max_new_tokens=4, warmup=0, cost_curve=False,
               report=False, threads=1, out=tmp_path / "run", dtype="bfloat16")
    harness.run(RunConfig(**cfg))
    (tmp_path / "run" / "summary.json").unlink()  # as if killed before its summary
    with pytest.raises(UsageError, match="decoded without --exact and this command runs with it"):
        harness.run(RunConfig(**cfg, exact=True))
