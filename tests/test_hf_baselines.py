"""The baselines decoded by transformers' own generate (solvers/hf_prompt_lookup.py, solvers/hf_assisted.py,
core/hf_generate.py): greedy output ids equal ntp's on random Llama and Qwen3 models in float32 (stop
tokens, a stop string, the budget, the end of the context), at batch 1 and 3; target forwards, drafts,
acceptances and draft-model forwards equal hand counts on scripted models (a prompt whose n-gram drafts are
accepted, a draft model wrong at one known place); the shipped model's default suite with the shipped
draft; specs, refusals, records and the run's table."""
from __future__ import annotations

import csv
import dataclasses
import json

import pytest
import torch
from transformers import LlamaForCausalLM

from scale_models import build_scale_model
from sbd_bench.core import hf_generate
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import ModelError, load_model
from sbd_bench.registry import RegistryError, parse_solver_spec, solver_registry
from sbd_bench.types import SamplingError, SolverError, UsageError
from tiny_models import build_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

RECORD_FIELDS = ("output_ids", "output_text", "stop_reason", "nfe", "prefill_forwards", "revealed_per_forward",
                 "forwards_per_block", "drafted_per_block", "accepted_per_block", "replaced_per_block", "draft_forwards")
PROMPTS = ["1+2=", "12*3=", "abc", "9", "44+55-3=", "hij*hij*hij*hij*hij*hij*hij*hij*hij=", "c", "abab ab"]


def _spec(spec: str):
    return parse_solver_spec(spec, solver_registry())


def _records(gens):
    return [{f: getattr(g, f) for f in RECORD_FIELDS} for g in gens]


# ------------------------------------------------------------- random models: output = NTP's, exactly
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def _models(root, family: str):
    """A sharpened random model (48 positions: long prompts reach the end of the context) with '-' as a
    second stop token, and a smaller random draft with its tokenizer (another seed: it disagrees often)."""
    target = build_scale_model(root / f"{family}-target", family=family, max_positions=48)
    draft = build_scale_model(root / f"{family}-draft", family=family, seed=1, hidden=16, layers=1)
    lm = load_model(target, device="cpu", dtype="float32")
    dash = lm.tokenizer.convert_tokens_to_ids("-")  # a stop token this model emits at varied points
    return dataclasses.replace(lm, stop_token_ids=(*lm.stop_token_ids, dash)), str(draft), str(target)


@pytest.mark.parametrize("family, stop_strings", [("llama", ()), ("qwen3", ("3g",))],
                         ids=["llama-stop-tokens", "qwen3-stop-string"])
def test_greedy_output_is_ntp_output_at_batch_one_and_three(root, family, stop_strings):
    lm, draft, target = _models(root, family)
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]

    def decoder():
        return Decoder(lm, block_size=4, max_new_tokens=14, stop_strings=stop_strings)

    ntp = [decoder().generate(p, _spec("ntp")[0]) for p in prompts]
    seen = {"accepted": 0, "replaced": 0, "undrafted": 0, "reasons": {g.stop_reason for g in ntp}}
    # n-grams of 1 and 3, a draft model that disagrees often and one that agrees always (the model itself)
    configs = _spec(f"hf_prompt_lookup:tokens=2;ngram=1+hf_prompt_lookup:tokens=10;ngram=3"
                    f"+hf_assisted:draft={draft};tokens=4+hf_assisted:draft={target};tokens=3")[1:]
    for solver in configs:
        one = _records(decoder().generate(p, solver) for p in prompts)
        for g, ref in zip(one, ntp):
            assert (g["output_ids"], g["stop_reason"]) == (ref.output_ids, ref.stop_reason), solver.label
            assert sum(g["revealed_per_forward"]) == len(g["output_ids"]) and len(g["revealed_per_forward"]) == g["nfe"]
            assert min(g["revealed_per_forward"]) >= 1  # no forward after the one that committed the stop
            assert g["forwards_per_block"] == [1] * g["nfe"] and g["prefill_forwards"] == 0
            assert len(g["drafted_per_block"]) == len(g["accepted_per_block"]) == len(g["replaced_per_block"]) == g["nfe"]
            assert all(0 <= a <= d for a, d in zip(g["accepted_per_block"], g["drafted_per_block"]))
            assert all(r <= a + 1 for r, a in zip(g["revealed_per_forward"], g["accepted_per_block"]))
            assert (g["draft_forwards"] > 0) == (solver.name == "hf_assisted")
            if not any(g["drafted_per_block"]):  # nothing drafted: one forward per token, as NTP
                assert g["nfe"] == ref.nfe == len(g["output_ids"])
                seen["undrafted"] += 1
            seen["accepted"] += sum(g["accepted_per_block"])
            seen["replaced"] += sum(g["replaced_per_block"])
        if solver is configs[0] or solver is configs[2]:  # generate takes one row at a time: a batch goes row by row
            three = []
            for i in range(0, len(prompts), 3):
                three += _records(decoder().generate_batch(prompts[i : i + 3], solver))
            assert three == one, solver.label
    # the cases the comparison must cover did occur
    assert seen["accepted"] > 0 and seen["replaced"] > 0 and seen["undrafted"] > 0
    assert "stop_string" in seen["reasons"] if stop_strings else {"max_new_tokens", "context", "stop_token"} <= seen["reasons"]


# --------------------------------------------------------------- scripted models: counts by hand
class Scripted(LlamaForCausalLM):
    """A real tiny Llama (real cache traffic) whose logits are a script: the query at position pos predicts
    script[pos + 1 - prompt_len], one logit at 10 and the rest at 0."""

    script: list[int] = []
    prompt_len: int = 0

    def forward(self, input_ids=None, cache=None, **kwargs):
        start = cache.get_seq_length() if cache is not None else 0
        out = super().forward(input_ids=input_ids, cache=cache, **kwargs)
        end, kept = start + input_ids.shape[1], out.logits.shape[1]  # logits_to_keep: the last queries only
        logits = torch.zeros_like(out.logits)
        for q, pos in enumerate(range(end - kept, end)):
            i = pos + 1 - self.prompt_len
            if 0 <= i < len(self.script):
                logits[0, q, self.script[i]] = 10.0
        out.logits = logits
        return out


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("scripted") / "llama", seed=0)


def scripted(path, text: str, prompt_ids: list[int]):
    lm = load_model(path, device="cpu", dtype="float32")
    model = Scripted.from_pretrained(path)
    model.script = [lm.tokenizer.eos_token_id if c == "$" else lm.tokenizer.convert_tokens_to_ids(c) for c in text]
    model.prompt_len = len(prompt_ids)
    return dataclasses.replace(lm, model=model.eval())


def test_prompt_lookup_counts_by_hand(tiny_path):
    """Prompt 'xabcdefghijx', the model writes 'abcdefghij' then EOS; tokens=4, ngram=2. Forward 1: the last
    1-gram 'x' (no 2-gram matches) finds 'abcd' after the first x: all 4 accepted, then NTP's 'e'. Forward 2:
    'de' finds 'fghi': accepted, then 'j'. Forward 3: 'ij' finds 'xabc' (the prompt's end, then the output):
    rejected at once, NTP's EOS instead. 3 target forwards for 11 tokens (NTP: 11)."""
    prompt = load_model(tiny_path, device="cpu").tokenizer("xabcdefghijx")["input_ids"]
    lm = scripted(tiny_path, "abcdefghij$", prompt)
    ntp = Decoder(lm, max_new_tokens=40).generate(prompt, _spec("ntp")[0])
    gen = Decoder(lm, max_new_tokens=40).generate(prompt, _spec("hf_prompt_lookup:tokens=4;ngram=2")[1])
    assert gen.output_ids == ntp.output_ids and gen.output_text == "abcdefghij" and gen.stop_reason == "stop_token"
    assert (ntp.nfe, gen.nfe, gen.prefill_forwards) == (11, 3, 0)
    assert gen.revealed_per_forward == [5, 5, 1]
    assert (gen.drafted_per_block, gen.accepted_per_block, gen.replaced_per_block) == ([4, 4, 4], [4, 4, 0], [0, 0, 1])
    assert gen.draft_forwards == 0
    # the budget cuts the second forward's five tokens to three
    short = Decoder(lm, max_new_tokens=8).generate(prompt, _spec("hf_prompt_lookup:tokens=4;ngram=2")[1])
    assert short.output_ids == ntp.output_ids[:8] and short.stop_reason == "max_new_tokens"
    assert (short.nfe, short.revealed_per_forward) == (2, [5, 3])


def test_the_mask_token_is_never_emitted(tiny_path):
    """The model's top logit at the third token is the mask token's: the core takes the next best (all
    tied at 0: the first id), and so must generate."""
    prompt = load_model(tiny_path, device="cpu").tokenizer("Q:")["input_ids"]
    lm = scripted(tiny_path, "ab", prompt)
    lm.model.script = lm.model.script + [lm.mask_token_id, lm.tokenizer.eos_token_id]
    ntp = Decoder(lm, max_new_tokens=10).generate(prompt, _spec("ntp")[0])
    assert lm.mask_token_id not in ntp.output_ids and len(ntp.output_ids) == 4
    for spec in ("hf_prompt_lookup", f"hf_assisted:draft={tiny_path}"):
        assert Decoder(lm, max_new_tokens=10).generate(prompt, _spec(spec)[1]).output_ids == ntp.output_ids, spec


def test_assisted_counts_by_hand(tiny_path, monkeypatch):
    """The model writes 'abcdefghij' then EOS; the draft model the same but 'X' for 'e'; tokens=3. Forward 1:
    'abc' drafted, accepted, then 'd'. Forward 2: 'Xfg' rejected at once, 'e' instead. Forward 3: 'fgh'
    accepted, then 'i'. Forward 4: 'j' and EOS drafted (the draft stops at EOS), accepted. The draft model
    spends one forward per drafted token: 3 + 3 + 3 + 2."""
    prompt = load_model(tiny_path, device="cpu").tokenizer("Q:")["input_ids"]
    lm = scripted(tiny_path, "abcdefghij$", prompt)
    draft = scripted(tiny_path, "abcdXfghij$", prompt)
    monkeypatch.setattr(hf_generate, "load_draft", lambda target, name: draft)
    ntp = Decoder(lm, max_new_tokens=40).generate(prompt, _spec("ntp")[0])
    gen = Decoder(lm, max_new_tokens=40).generate(prompt, _spec("hf_assisted:draft=scripted;tokens=3")[1])
    assert gen.output_ids == ntp.output_ids and gen.output_text == "abcdefghij" and ntp.nfe == 11
    assert (gen.nfe, gen.revealed_per_forward) == (4, [4, 1, 4, 2])
    assert (gen.drafted_per_block, gen.accepted_per_block, gen.replaced_per_block) == ([3, 3, 3, 2], [3, 0, 3, 2],
                                                                                      [0, 1, 0, 0])
    assert gen.draft_forwards == 11
    # the shared draft's own generation_config is as it was: tokens=3 held for that call only
    before = draft.model.generation_config.num_assistant_tokens
    two = Decoder(lm, max_new_tokens=40).generate(prompt, _spec("hf_assisted:draft=scripted;tokens=2")[1])
    assert before != 3 and max(two.drafted_per_block) == 2 and two.output_ids == ntp.output_ids
    assert draft.model.generation_config.num_assistant_tokens == before


# ------------------------------------------------------------------------------------ the shipped model
def test_shipped_baselines_equal_ntp_on_the_default_suite(tmp_path):
    """The first 10 examples of each task of the default suite on sbd-tiny (all 160: scripts/lossless_check.sh,
    tox -e lossless, and results/baseline), prompt lookup and assisted decoding with the shipped draft
    ntp-draft: output ids equal ntp's; drafts were accepted on every task; a subset at batch 4 gives the same
    records."""
    from sbd_bench.analysis.records import read_records
    from sbd_bench.runner.harness import RunConfig, run
    from sbd_bench.tasks import expand_tasks

    spec = "hf_prompt_lookup+hf_assisted"
    out = run(RunConfig(model="sbd-tiny", tasks=expand_tasks("suite"), solvers=spec, out=tmp_path / "b1", device="cpu",
                        dtype="float32", cost_curve=False, report=False, threads=1, warmup=0, limit=10, trace=0))
    records = read_records(out / "samples.jsonl")
    ntp = {(r["task"], r["id"]): r for r in records if r["solver"] == "ntp"}
    assert len(ntp) == 40 and len(records) == 3 * 40 and not any(r["error"] for r in records)
    for rec in records:
        assert rec["output_ids"] == ntp[(rec["task"], rec["id"])]["output_ids"], (rec["config"], rec["task"], rec["id"])
        assert ("draft_forwards" in rec) == (rec["solver"] != "ntp")
    rows = json.loads((out / "summary.json").read_text())["rows"]
    baselines = [r for r in rows if r["solver"] != "ntp"]
    assert len(baselines) == 8 and all(r["ntp_match_rate"] == 1.0 and r["acceptance_rate"] > 0 for r in baselines)
    assert all((r["draft_forwards"] > 0) == (r["solver"] == "hf_assisted") for r in baselines)
    batched = run(RunConfig(model="sbd-tiny", tasks=["record", "tag"], solvers=spec, out=tmp_path / "b4", limit=4,
                            device="cpu", dtype="float32", batch_size=4, cost_curve=False, report=False, threads=1,
                            warmup=0, trace=0))
    skip = ("wall_time_s", "prefill_time_s", "decode_time_s", "memory", "peak_memory_bytes", "peak_memory_source",
            "batch_size")
    four = [{k: v for k, v in r.items() if k not in skip} for r in read_records(batched / "samples.jsonl")]
    one = {(r["config"], r["task"], r["id"]): {k: v for k, v in r.items() if k not in skip} for r in records}
    assert four and all(r == one[(r["config"], r["task"], r["id"])] for r in four)


# ------------------------------------------------------------------------------------ specs, refusals
def test_specs_labels_order_and_the_ntp_baseline():
    configs = _spec("hf_assisted:tokens=3+fixed_k:k=16;verify=on+hf_prompt_lookup:ngram=3")
    assert [c.label for c in configs] == ["ntp", "fixed_k:k=16,verify=on", "hf_assisted:draft=ntp-draft,tokens=3",
                                          "hf_prompt_lookup:tokens=10,ngram=3"]
    assert [c.label for c in _spec("hf_prompt_lookup")] == ["ntp", "hf_prompt_lookup:tokens=10,ngram=2"]
    assert not any(c.name.startswith("hf_") for c in _spec("all"))  # named, never in all (docs/baselines.md)
    assert [c.label for c in _spec("all+hf_prompt_lookup")][-1] == "hf_prompt_lookup:tokens=10,ngram=2"


@pytest.mark.parametrize("spec, error, message", [
    ("hf_prompt_lookup:tokens=0", SolverError, "tokens must be >= 1"),
    ("hf_prompt_lookup:ngram=0", SolverError, "ngram must be >= 1"),
    ("hf_assisted:tokens=0", SolverError, "tokens must be >= 1"),
    ("hf_prompt_lookup:verify=on", SolverError, "decodes with transformers' generate"),
    ("hf_assisted:drafts=x", SolverError, "has no parameter 'drafts'"),
    ("hf_prompt_lookups", RegistryError, "did you mean 'hf_prompt_lookup'"),
    ("hf_prompt_lookup:temperature=0.7", SamplingError, "run greedily only"),
    ("hf_assisted:temperature=0,1", SamplingError, "hf_assisted:draft=ntp-draft,tokens=5,temperature=1.0: the baselines"),
])
def test_bad_specs(spec, error, message):
    with pytest.raises(error, match=message):
        _spec(spec)


def test_an_empty_draft_is_refused():
    with pytest.raises(SolverError, match="draft must name a model folder"):
        solver_registry()["hf_assisted"](draft=" ")


def test_a_draft_model_is_checked_before_anything_is_decoded(root, tmp_path):
    lm, draft, _ = _models(root, "llama")
    hf_generate.check_baselines(lm, _spec(f"hf_assisted:draft={draft}"))
    with pytest.raises(ModelError, match="draft=.*none,tokens=5: draft model folder .* does not exist"):
        hf_generate.check_baselines(lm, _spec(f"hf_assisted:draft={tmp_path / 'none'}"))
    other = build_tiny_model(tmp_path / "other", seed=0, hidden=16, layers=1, alphabet="xyz")
    with pytest.raises(ModelError, match="another tokenizer"):
        hf_generate.check_baselines(lm, _spec(f"hf_assisted:draft={other}"))
    with pytest.raises(UsageError, match="drop --exact"):
        hf_generate.check_baselines(dataclasses.replace(lm, exact=True), _spec("hf_prompt_lookup"))


# ------------------------------------------------------------------------- records, table, report, compare
PL = "hf_prompt_lookup:tokens=10,ngram=2"


def generate_records():
    """standard_records plus a prompt-lookup configuration: output = NTP's, drafts judged per target forward."""
    from measure_fixtures import crafted_record, standard_records

    records = standard_records()
    for task in ("arith", "copy"):
        for i in range(5):
            rec = crafted_record(PL, task, str(i), nfe=4, tokens=8 + i, correct=True, decode_time_s=0.05)
            rec["solver"], rec["params"], rec["prefill_forwards"] = "hf_prompt_lookup", {"tokens": 10, "ngram": 2}, 0
            rec["forwards_per_block"] = [1, 1, 1, 1]
            rec["drafted_per_block"], rec["accepted_per_block"] = [10, 4, 0, 6], [2, 1, 0, 4 + i % 2]
            rec["replaced_per_block"], rec["draft_forwards"] = [1, 1, 0, 1], 0
            records.append(rec)
    return records


def test_generate_rows_in_the_summary_the_table_the_warning_and_compare(tmp_path, capsys):
    from measure_fixtures import crafted_run

    from sbd_bench.analysis import report
    from sbd_bench.analysis.metrics import ntp_mismatch_warning, summarize
    from sbd_bench.cli import _print_table, main

    rows = {(r["config"], r["task"]): r for r in summarize(generate_records())}
    assert rows[(PL, "arith")]["acceptance_rate"] == pytest.approx((5 * 7 + 2) / (5 * 20))
    assert rows[(PL, "arith")]["draft_forwards"] == 0 and rows[("ntp", "arith")]["draft_forwards"] is None
    assert rows[(PL, "arith")]["ntp_match_rate"] == 1.0
    _print_table(list(rows.values()))
    header, *lines = capsys.readouterr().err.splitlines()
    at = header.index("= NTP %")
    shown = {(line.split()[0], line.split()[1]): line[at : at + 7].strip() for line in lines}
    assert shown[("arith", PL)] == "100.0" and shown[("arith", "fixed_k:k=4")] == "-"
    assert ntp_mismatch_warning(generate_records(), exact=False) is None
    records = generate_records()
    next(r for r in records if r["config"] == PL and r["task"] == "arith")["output_ids"] = [9]
    warning = ntp_mismatch_warning(records, exact=False)
    assert warning.startswith("1 of 10 samples of generate baselines (1 configuration x task row(s)) differ")
    assert "transformers' generate verifies drafts" in warning
    baseline = crafted_run(tmp_path / "base", generate_records())
    capsys.readouterr()
    assert main(["compare", str(baseline), str(crafted_run(tmp_path / "lossy", records))]) == 1
    assert f"REGRESSION: {PL} on arith: generate baseline output differs from NTP's" in capsys.readouterr().err
    fig = report.plot_accuracy_vs_speed(summarize(generate_records()), tmp_path / "p.png")
    panel = next(ax for ax in fig.axes if ax.get_visible())
    assert len([c for c in panel.collections if c.get_gid() == "generate"]) == 2  # its NFE and wall-clock points
    run_dir = report.write_report(crafted_run(tmp_path / "run", generate_records())).parent
    csv_rows = list(csv.DictReader((run_dir / "rows.csv").read_text().splitlines()))
    assert {(r["config"], r["draft_forwards"]) for r in csv_rows if r["solver"] != "fixed_k"} == {
        (PL, "0"), ("ntp", ""), ("entropy_bounded:gamma=0.35,proxy=entropy", "")}


def test_a_missing_draft_is_one_line_and_no_run_folder(tmp_path, capsys):
    from sbd_bench.cli import main

    out = tmp_path / "run"
    assert main(["run", "--solver", "hf_assisted:draft=nowhere", "--limit", "1", "--out", str(out), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: hf_assisted:draft=nowhere,tokens=5: draft model folder 'nowhere' does not exist: pass a local "
                   "Hugging Face folder (config.json + weights + tokenizer) or a shipped model name (ntp-draft, ntp-tiny, "
                   "sbd-tiny)"] and not out.exists()
