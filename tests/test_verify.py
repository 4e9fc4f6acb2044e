"""Verified decoding (the core's verify mode, ``name:...;verify=on``): output ids equal NTP's, token for
token, on random Llama and Qwen3 (GQA) models in float32, at batch 1 and 4, fast path on and off, with
stops, stop strings, budgets and the end of the context; the accept/replace/rollback bookkeeping is
exact on a scripted model (NFE, tokens committed per forward, cache length after a rejection); every
carried forward sees exactly the committed tokens' keys/values; the spec, records, summary rows,
report and compare know verified configurations. The shipped model over a subset of the suite is
here; the whole suite (160/160) is ``scripts/lossless_check.sh``."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from scale_models import build_scale_model
from sbd_bench.core import cache as cache_module
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.verify import verify_drafts
from sbd_bench.core.model import load_model
from sbd_bench.registry import RegistryError, parse_solver_spec, solver_registry
from sbd_bench.types import GenerateBaseline, SolverError
from test_stops import ScriptedLlama

pytestmark = pytest.mark.usefixtures("one_thread")

RECORD_FIELDS = ("output_ids", "output_text", "stop_reason", "nfe", "prefill_forwards", "revealed_per_forward",
                 "forwards_per_block", "drafted_per_block", "accepted_per_block", "replaced_per_block",
                 "remasked_per_block", "forced_per_block")
# one forward per block (fixed_k:k=4 at k=4), several (EB, left_to_right), a random order, a threshold, one that
# reads the previous forward (klass) and one that revokes with the shadow (wino)
VERIFIED = ("fixed_k:k=4;verify=on+entropy_bounded:gamma=0.35,1.5;verify=on+random_order:n=2;verify=on"
            "+left_to_right:n=1;verify=on+confidence:verify=on+klass:verify=on+wino:tau_in=0.3;verify=on")
PROMPTS = ["1+2=", "12*3=", "abc", "9", "44+55-3=", "hij*hij*hij*hij*hij*hij*hij*hij*hij=", "c"]


def _spec(spec: str):
    return parse_solver_spec(spec, solver_registry())


# ------------------------------------------------------------------------------- the rule itself
def test_the_rule_keeps_the_agreeing_prefix_then_ntps_token():
    # pending = last committed token, then drafts; ntp[i] = NTP's token after pending[i]
    assert verify_drafts([7, 1, 2, 3], [1, 2, 3, 4]) == ([1, 2, 3, 4], 3, False)  # all agree, then the next first
    assert verify_drafts([7, 1, 2, 3], [1, 9, 3, 4]) == ([1, 9], 1, True)  # the first that differs is replaced
    assert verify_drafts([7, 1, 2, 3], [5, 2, 3, 4]) == ([5], 0, True)  # even the first draft
    assert verify_drafts([7], [4]) == ([4], 0, False)  # nothing drafted: NTP's token alone
    assert verify_drafts([7, 1, 2], [1, 2]) == ([1, 2], 2, False)  # a final check: nothing follows the last
    assert verify_drafts([7, 1, 2], [1, 8]) == ([1, 8], 1, True)


# ----------------------------------------------------------------- a scripted model: exact bookkeeping
class DraftingLlama(ScriptedLlama):
    """test_stops' scripted Llama (causal logits predict script[i + 1], block logits script[i]) whose block
    queries predict ``wrong[i]`` instead at generated index i: drafts that NTP rejects."""

    wrong: dict[int, int] = {}

    def forward(self, input_ids=None, position_ids=None, **kwargs):
        out = super().forward(input_ids=input_ids, position_ids=position_ids, **kwargs)
        for q, pos in enumerate(position_ids[0].tolist()):
            is_block = bool(input_ids[0, q] == self.mask_id) or q >= self.n_causal(input_ids)
            if is_block and pos - self.prompt_len in self.wrong:
                out.logits[0, q] = 0.0
                out.logits[0, q, self.wrong[pos - self.prompt_len]] = 10.0
        return out


class TracingDecoder(Decoder):
    """Records (cache length before, query tokens) of every forward, and the text each one carries."""

    def forward(self, ids, positions, pattern, cache, phase="decode", keep=0, **kw):
        self.trace.append((phase, cache.length, ids.shape[1]))
        return super().forward(ids, positions, pattern, cache, phase, keep, **kw)

    def carry_step(self, pending, *args):
        if pending.shape[1]:
            self.carried.append(self.lm.tokenizer.decode(pending[0]))
        return super().carry_step(pending, *args)


def _scripted(path, text: str, wrong: dict[int, str], k: int = 4):
    lm = load_model(path, device="cpu", dtype="float32")
    model = DraftingLlama.from_pretrained(path)
    tok = lm.tokenizer
    token = {c: tok.eos_token_id if c == "$" else tok.convert_tokens_to_ids(c) for c in set(text) | set(wrong.values())}
    prompt = tok("Q:")["input_ids"]
    model.script, model.sharpness, model.prompt_len = [token[c] for c in text], [5.0] * len(text), len(prompt)
    model.mask_id, model.k, model.block_query = lm.mask_token_id, k, True
    model.wrong = {i: token[c] for i, c in wrong.items()}
    return dataclasses.replace(lm, model=model.eval()), prompt


def _trace(lm, prompt, spec: str, k: int = 4, **kw):
    decoder = TracingDecoder(lm, block_size=k, **kw)
    decoder.trace, decoder.carried = [], []
    gen = decoder.generate(prompt, _spec(spec)[-1])
    gen.carried = decoder.carried
    return gen, decoder.trace


def test_accept_replace_and_rollback_one_forward_per_block(tiny_models):
    # the block predicts 'Y' at index 4, a block's first position: NTP's token is taken there instead
    lm, prompt = _scripted(tiny_models["llama"], "abcdefghij$", wrong={4: "Y", 5: "X"})
    P = len(prompt)
    gen, trace = _trace(lm, prompt, "fixed_k:k=4;verify=on", max_new_tokens=64)
    assert gen.output_text == "abcdefghij" and gen.stop_reason == "stop_token" and gen.tokens == 11
    # F1 carries the last prompt token: NTP's 'a' starts block 0, 'bcd' drafted. F2 carries 'abcd': all
    # agree, NTP's 'e' (not the block's 'Y') starts block 1, 'Xgh' drafted. F3 carries 'eXgh': 'X' is replaced by NTP's 'f',
    # 'gh' dropped and rolled back. F4 carries 'f': 'g' starts block 3, 'hij' drafted. F5 carries 'ghij':
    # all agree, NTP's '$' ends it.
    assert gen.nfe == 5 and gen.revealed_per_forward == [1, 4, 1, 1, 4]
    assert gen.forwards_per_block == [1, 1, 1, 1, 1]
    assert gen.drafted_per_block == [3, 3, 0, 3, 0]
    assert gen.accepted_per_block == [3, 0, 0, 3, 0]
    assert gen.replaced_per_block == [0, 1, 0, 0, 0]
    # (cache length before, queries): the rejected 'Xgh' left nothing behind; F4 starts at P + 5
    assert trace == [("prefill", 0, P - 1), ("decode", P - 1, 5), ("decode", P, 8), ("decode", P + 4, 8),
                     ("decode", P + 5, 5), ("decode", P + 6, 8)]
    assert gen.carried == [":", "abcd", "eXgh", "f", "ghij"]


def test_a_drafted_stop_is_verified_before_it_stops(tiny_models):
    # the block predicts the stop token at index 3, where NTP says 'd': drafting stops there, the final
    # check (the drafts minus the last, no block) replaces it, and decoding goes on
    lm, prompt = _scripted(tiny_models["llama"], "abcdefg$", wrong={3: "$"})
    P = len(prompt)
    gen, trace = _trace(lm, prompt, "fixed_k:k=4;verify=on", max_new_tokens=64)
    assert gen.output_text == "abcdefg" and gen.stop_reason == "stop_token"
    assert gen.nfe == 4 and gen.revealed_per_forward == [1, 3, 1, 3]
    assert gen.drafted_per_block == [3, 0, 3, 0] and gen.accepted_per_block == [2, 0, 3, 0]
    assert gen.replaced_per_block == [1, 0, 0, 0] and gen.forwards_per_block == [1, 1, 1, 1]
    assert trace == [("prefill", 0, P - 1), ("decode", P - 1, 5), ("decode", P, 3), ("decode", P + 3, 5),
                     ("decode", P + 4, 3)]
    assert gen.carried == [":", "abc", "d", "efg"]  # the final checks carry the drafts but the last


def test_several_forwards_per_block_and_the_budget(tiny_models):
    # one token per forward: block 0 takes 3 forwards; the budget of 6 ends block 1's drafting after 'f',
    # and the final check costs one more forward, a single causal query
    lm, prompt = _scripted(tiny_models["llama"], "abcdefgh", wrong={})
    P = len(prompt)
    gen, trace = _trace(lm, prompt, "fixed_k:k=1;verify=on", max_new_tokens=6)
    assert gen.output_text == "abcdef" and gen.stop_reason == "max_new_tokens"
    assert gen.nfe == 5 and gen.revealed_per_forward == [1, 0, 0, 4, 1]
    assert gen.forwards_per_block == [3, 1, 1] and gen.drafted_per_block == [3, 1, 0]
    assert gen.accepted_per_block == [3, 1, 0] and gen.replaced_per_block == [0, 0, 0]
    assert trace == [("prefill", 0, P - 1), ("decode", P - 1, 5), ("decode", P, 4), ("decode", P, 4),
                     ("decode", P, 8), ("decode", P + 4, 1)]
    assert gen.carried == [":", "abcd", "e"]


def test_several_forwards_per_block_can_cost_more_forwards_than_ntp(tiny_models):
    # every block's first draft is wrong: each block spends 3 forwards drafting and commits 1 token, and
    # the next block's first forward commits NTP's replacement: 2 tokens per 4 forwards
    text = "abcdefghijkl$"
    lm, prompt = _scripted(tiny_models["llama"], text, wrong={i: "X" for i in range(len(text))})
    gen, _ = _trace(lm, prompt, "fixed_k:k=1;verify=on", max_new_tokens=64)
    ntp, _ = _trace(lm, prompt, "ntp", max_new_tokens=64)
    assert gen.output_ids == ntp.output_ids and ntp.nfe == len(text) == 13
    assert gen.nfe > ntp.nfe and set(gen.replaced_per_block) == {0, 1}
    one_forward, _ = _trace(lm, prompt, "fixed_k:k=4;verify=on", max_new_tokens=64)
    assert one_forward.output_ids == ntp.output_ids and one_forward.nfe == ntp.nfe  # never more with one per block


# ------------------------------------------------------------- random models: output = NTP's, exactly
@pytest.fixture(scope="module", params=["llama", "qwen3"])
def lm(request, tmp_path_factory):
    path = build_scale_model(tmp_path_factory.mktemp(request.param), family=request.param, max_positions=48)
    model = load_model(path, device="cpu", dtype="float32")
    dash = model.tokenizer.convert_tokens_to_ids("-")  # a stop token this model emits at varied points
    return dataclasses.replace(model, stop_token_ids=(*model.stop_token_ids, dash))


def _records(gens):
    return [{f: getattr(g, f) for f in RECORD_FIELDS} for g in gens]


@pytest.mark.parametrize("fast, stop_strings", [(False, ()), (True, ("3g",))],
                         ids=["reference-cache-stop-tokens", "fast-path-stop-string"])
def test_verified_output_is_ntp_output_at_batch_one_and_four(lm, fast, stop_strings, monkeypatch):
    keeps = []  # rows that accept different lengths realign the cache: make sure that path ran
    for cls in (cache_module.KVCache, cache_module.StaticKVCache):
        monkeypatch.setattr(cls, "keep", lambda self, columns, _keep=cls.keep: keeps.append(1) or _keep(self, columns))
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]

    def decoder():
        return Decoder(lm, block_size=4, max_new_tokens=14, stop_strings=stop_strings, seed=3, fast=fast)

    ntp = [decoder().generate(p, _spec("ntp")[0]) for p in prompts]
    seen = {"accepted": 0, "replaced": 0, "reasons": {g.stop_reason for g in ntp}}
    for solver in _spec(VERIFIED)[1:]:
        one = _records(decoder().generate(p, solver) for p in prompts)
        for g, ref in zip(one, ntp):
            assert (g["output_ids"], g["stop_reason"]) == (ref.output_ids, ref.stop_reason), solver.label
            assert sum(g["revealed_per_forward"]) == len(g["output_ids"]) and len(g["revealed_per_forward"]) == g["nfe"]
            assert sum(g["forwards_per_block"]) == g["nfe"]
            assert len(g["drafted_per_block"]) == len(g["accepted_per_block"]) == len(g["forwards_per_block"])
            assert all(0 <= a <= d for a, d in zip(g["accepted_per_block"], g["drafted_per_block"]))
            seen["accepted"] += sum(g["accepted_per_block"])
            seen["replaced"] += sum(g["replaced_per_block"])
        four = []
        for i in range(0, len(prompts), 4):
            four += _records(decoder().generate_batch(prompts[i : i + 4], solver))
        assert four == one, solver.label
    # the cases the comparison must cover did occur
    assert seen["accepted"] > 0 and seen["replaced"] > 0 and keeps
    assert "stop_string" in seen["reasons"] if stop_strings else {"max_new_tokens", "context", "stop_token"} <= seen["reasons"]


class CarryRecorder(Decoder):
    def carry_step(self, pending, block, start, *args):
        ntp_logits, logits = super().carry_step(pending, block, start, *args)
        if pending.shape[1]:  # block_step's drafting forwards carry nothing
            self.calls.append((start, pending[0].tolist(), ntp_logits[0].clone()))
        return ntp_logits, logits


def test_every_carried_forward_sees_exactly_the_committed_tokens(lm):
    """No rejected key/value stays: each carried token's logits equal a full causal forward over the
    committed tokens before it (prompt + output) and the carried ones."""
    prompt = lm.tokenizer("12*3=")["input_ids"]
    for solver in _spec("fixed_k:k=4;verify=on+entropy_bounded:verify=on")[1:]:
        decoder = CarryRecorder(lm, block_size=4, max_new_tokens=24)
        decoder.calls = []
        gen = decoder.generate(prompt, solver)
        sequence = prompt + gen.output_ids
        assert sum(gen.replaced_per_block) > 0  # rejections happened, and were rolled back
        for start, carried, logits in decoder.calls:
            ids = torch.tensor([sequence[: start - len(carried)] + carried])
            with torch.no_grad():
                reference = lm.model(input_ids=ids).logits[0, -len(carried):]
            reference[:, lm.mask_token_id] = float("-inf")
            assert torch.allclose(logits, reference, atol=1e-4, rtol=0), (start, (logits - reference).abs().max())


# ------------------------------------------------------------------------------------------- specs
def test_verify_in_specs_labels_and_params():
    labels = [s.label for s in _spec("entropy_bounded:gamma=1;verify=on+fixed_k:k=16;verify=on,off")]
    assert labels == ["ntp", "entropy_bounded:gamma=1.0,proxy=entropy,verify=on", "fixed_k:k=16,verify=on",
                      "fixed_k:k=16"]
    verified = _spec("fixed_k:k=16;verify=on")[1]
    assert verified.verify and verified.name == "fixed_k" and verified.params == {"k": 16, "verify": "on"}
    assert _spec("fixed_k:k=16;verify=off")[1].label == "fixed_k:k=16"  # unverified labels stay as they were
    assert _spec("left_to_right:verify=on")[1].label == "left_to_right:n=1,verify=on"
    everything = _spec("all")
    named = [name for name, cls in solver_registry().items() if not issubclass(cls, GenerateBaseline)]  # not in all
    assert any(s.verify for s in everything) and [s.label for s in everything if not s.verify] == [
        s.label for s in _spec(",".join(named))]


@pytest.mark.parametrize("spec, message", [
    ("ntp:verify=on", "verify=on applies to block solvers"),
    ("fixed_k:verify=yes", "must be 'on' or 'off'"),
])
def test_bad_verify_specs(spec, message):
    with pytest.raises(SolverError, match=message):
        _spec(spec)


PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar
from sbd_bench.types import Solver, reveal_top

@dataclass(frozen=True)
class {cls}(Solver):
    name: ClassVar[str] = "{name}"
    {field}
    def select(self, view):
        return reveal_top(view.margin, view.masked, 3)
'''


def test_a_plugin_gets_verify_without_code(tmp_path, lm):
    (tmp_path / "mine.py").write_text(PLUGIN.format(cls="TopThreeMargin", name="top_three_margin", field=""))
    registry = solver_registry([tmp_path])
    solver = parse_solver_spec("top_three_margin:verify=on", registry)[1]
    assert solver.label == "top_three_margin:verify=on"
    prompt = lm.tokenizer("44+55-3=")["input_ids"]
    decoder = Decoder(lm, block_size=4, max_new_tokens=20)
    assert decoder.generate(prompt, solver).output_ids == decoder.generate(prompt, registry["ntp"]()).output_ids


def test_a_solver_parameter_named_verify_is_refused(tmp_path):
    (tmp_path / "own_verify.py").write_text(PLUGIN.format(cls="OwnVerify", name="own_verify", field="verify: bool = False"))
    with pytest.raises(RegistryError, match="has a parameter named 'verify'.*rename it"):
        solver_registry([tmp_path])


# ------------------------------------------------------------------- the shipped model, through the harness
SHIPPED_SPEC = "ntp+entropy_bounded:verify=on+fixed_k:k=16;verify=on+confidence:verify=on+left_to_right:verify=on"
SKIP_FIELDS = {"wall_time_s", "prefill_time_s", "decode_time_s", "peak_memory_bytes", "peak_memory_source", "memory",
               "batch_size"}


def nfe_minus_ntp(rec: dict) -> int:
    """What docs/decoding.md states: nfe - tokens (= NTP's nfe) = sum over blocks but the last of (forwards - 1 -
    accepted), + 1 when the last forward was a final check that confirmed every draft (no next token)."""
    f, a, revealed = rec["forwards_per_block"], rec["accepted_per_block"], rec["revealed_per_forward"]
    final_confirmed = int(len(f) > 1 and revealed[-1] == a[-2])
    return sum(fb - 1 - ab for fb, ab in zip(f[:-1], a[:-1])) + final_confirmed


def test_shipped_model_verified_equals_ntp_on_the_suite_subset(tmp_path):
    """The first 3 examples of every task of the suite on sbd-tiny (the whole suite:
    scripts/lossless_check.sh), at batch 1 and, with the fast path's static cache, at batch 4."""
    from sbd_bench.analysis.records import read_records
    from sbd_bench.runner.harness import RunConfig, run
    from sbd_bench.tasks import expand_tasks

    runs = {}
    for batch, fast in ((1, False), (4, True)):
        out = run(RunConfig(model="sbd-tiny", tasks=expand_tasks("suite"), solvers=SHIPPED_SPEC, out=tmp_path / f"b{batch}", limit=3, device="cpu",
                            dtype="float32", batch_size=batch, fast=fast, cost_curve=False, report=False, threads=1))
        runs[batch] = [{k: v for k, v in r.items() if k not in SKIP_FIELDS} for r in read_records(out / "samples.jsonl")]
        rows = [r for r in json.loads((out / "summary.json").read_text())["rows"] if r["params"].get("verify") == "on"]
        assert len(rows) == 4 * 4 and all(r["ntp_match_rate"] == 1.0 and r["n"] == 3 for r in rows)
        assert all(r["acceptance_rate"] is not None and 0 < r["acceptance_rate"] <= 1 for r in rows)
    assert runs[4] == runs[1]
    ntp = {(r["task"], r["id"]): r for r in runs[1] if r["solver"] == "ntp"}
    for rec in runs[1]:
        if rec["params"].get("verify") == "on":
            assert rec["output_ids"] == ntp[(rec["task"], rec["id"])]["output_ids"]
            assert rec["nfe"] - ntp[(rec["task"], rec["id"])]["nfe"] == nfe_minus_ntp(rec)
            if rec["config"] == "fixed_k:k=16,verify=on":  # one forward per block: never more than NTP
                assert set(rec["forwards_per_block"]) == {1} and rec["nfe"] <= rec["tokens"]


# ------------------------------------------------------------------------- records, report, compare
VFK = "fixed_k:k=4,verify=on"


def verified_records():
    """standard_records plus a verified configuration: output = NTP's, drafts judged per block."""
    from measure_fixtures import crafted_record, standard_records

    records = standard_records()
    for task in ("arith", "copy"):
        for i in range(5):
            rec = crafted_record(VFK, task, str(i), nfe=4, tokens=8 + i, correct=True, decode_time_s=0.02)
            rec["solver"], rec["params"] = "fixed_k", {"k": 4, "verify": "on"}
            rec["forwards_per_block"] = [1, 1, 1, 1]
            rec["drafted_per_block"], rec["accepted_per_block"] = [3, 3, 3, 0], [3, 1, 2 + (i % 2), 0]
            rec["replaced_per_block"] = [0, 1, 1 - i % 2, 0]
            records.append(rec)
    return records


def test_summary_rows_hold_acceptance_and_ntp_match():
    from sbd_bench.analysis.metrics import summarize

    records = verified_records()
    next(r for r in records if r["config"] == "fixed_k:k=4" and r["id"] == "1")["output_ids"] = [7]
    rows = {(r["config"], r["task"]): r for r in summarize(records)}
    assert rows[(VFK, "arith")]["acceptance_rate"] == pytest.approx((5 * 6 + 2) / (5 * 9))
    assert rows[(VFK, "arith")]["ntp_match_rate"] == 1.0 and rows[("ntp", "arith")]["acceptance_rate"] is None
    assert rows[("fixed_k:k=4", "arith")]["ntp_match_rate"] == 0.8 and rows[("fixed_k:k=4", "arith")]["acceptance_rate"] is None


def test_report_shows_acceptance_and_marks_verified_configurations(tmp_path):
    from measure_fixtures import crafted_run

    from sbd_bench.analysis import report
    from sbd_bench.analysis.metrics import summarize

    run_dir = crafted_run(tmp_path / "run", verified_records())
    text = report.write_report(run_dir).read_text()
    header = next(line for line in text.splitlines() if line.startswith("| task | config") and "acceptance" in line)
    cells = header.split(" | ")
    assert cells.index("acceptance %") == cells.index("tokens/forward") + 1
    line = next(line for line in text.splitlines() if line.startswith(f"| arith | {VFK} |") and " 71.1 " in line)
    assert line.split(" | ")[cells.index("acceptance %")] == "71.1"
    fig = report.plot_accuracy_vs_speed(summarize(verified_records()), tmp_path / "p.png")
    for ax in (ax for ax in fig.axes if ax.get_visible()):
        verified = [c for c in ax.collections if c.get_gid() == "verified"]
        assert len(verified) == 2  # the NFE point and the wall-clock point of the one verified configuration
        assert len(ax.collections) == 2 * 4


def test_run_table_shows_acceptance_of_verified_configurations(capsys):
    from sbd_bench.analysis.metrics import summarize
    from sbd_bench.cli import _print_table

    rows = summarize(verified_records())
    _print_table(rows)
    header, *lines = capsys.readouterr().err.splitlines()
    cells = header.split()
    assert cells.index("accept") == cells.index("tok/fwd") + 1  # beside tokens per forward, as in the report
    shown = {(line.split()[0], line.split()[1]): line.split()[cells.index("accept")] for line in lines}
    assert shown[("arith", VFK)] == shown[("copy", VFK)] == "0.711"  # (5 * 6 + 2) / (5 * 9) drafts confirmed
    assert {cell for (_, config), cell in shown.items() if config != VFK} == {"-"}
    assert len({len(line) for line in [header, *lines]}) == 1  # a '-' keeps its column's width: columns stay aligned
    at = header.index("= NTP %")  # the share of a verified row's examples whose output is NTP's
    ntp_percent = {(line.split()[0], line.split()[1]): line[at : at + 7].strip() for line in lines}
    assert ntp_percent[("arith", VFK)] == "100.0" and {c for (_, config), c in ntp_percent.items() if config != VFK} == {"-"}
    records = verified_records()
    next(r for r in records if r["config"] == VFK and r["task"] == "copy")["output_ids"] = [7]
    _print_table(summarize(records))
    assert [line[at : at + 7].strip() for line in capsys.readouterr().err.splitlines()
            if line.startswith("copy") and VFK in line] == ["80.0"]


def test_compare_gates_verified_rows(tmp_path, capsys):
    import copy

    from measure_fixtures import crafted_run

    from sbd_bench.cli import main

    baseline = crafted_run(tmp_path / "base", verified_records())
    assert main(["compare", str(baseline), str(crafted_run(tmp_path / "same", verified_records()))]) == 0
    for name, change, message in [
        ("nfe", lambda r: r.update(nfe=5), f"{VFK} on arith: nfe"),
        ("lossy", lambda r: r.update(output_ids=[9]), f"{VFK} on arith: verified output differs from NTP's"),
    ]:
        records = copy.deepcopy(verified_records())
        change(next(r for r in records if r["config"] == VFK and r["task"] == "arith" and r["id"] == "2"))
        capsys.readouterr()
        assert main(["compare", str(baseline), str(crafted_run(tmp_path / name, records))]) == 1, name
        assert f"REGRESSION: {message}" in capsys.readouterr().err


def test_compare_notes_a_difference_the_baseline_had_and_fails_it_with_exact(tmp_path, capsys):
    """Without --exact, bf16 rounding at near ties can move a verified output off NTP's: a run that
    differs where its baseline differed too gets a note (not a failure); one that differs where the
    baseline did not, or any with --exact, fails."""
    import copy

    from measure_fixtures import crafted_run

    from sbd_bench.cli import main

    def differing(ids):
        records = copy.deepcopy(verified_records())
        for rec in records:
            if rec["config"] == VFK and rec["task"] == "arith" and rec["id"] in ids:
                rec["output_ids"] = [9]
        return records

    for exact, base_ids, run_ids, status, line in [
        (False, {"2"}, {"2"}, 0, f"note: {VFK} on arith: verified output differs from NTP's on 20.0% of examples "
                                 f"(baseline 20.0%)"),
        (False, {"2"}, {"2", "3"}, 0, "note:"),  # rounding in both runs: how many moves with the machine
        (False, set(), {"2"}, 1, f"REGRESSION: {VFK} on arith: verified output differs from NTP's"),
        (True, {"2"}, {"2"}, 1, f"REGRESSION: {VFK} on arith: verified output differs from NTP's on 20.0% of "
                                f"examples (must be none)"),
    ]:
        name = f"{exact}-{len(base_ids)}-{len(run_ids)}"
        baseline = crafted_run(tmp_path / f"base-{name}", differing(base_ids), exact=exact)
        capsys.readouterr()
        assert main(["compare", str(baseline), str(crafted_run(tmp_path / name, differing(run_ids), exact=exact))]) == status
        assert line in capsys.readouterr().err, name


def test_report_warns_when_verified_outputs_differ(tmp_path):
    from measure_fixtures import crafted_run

    from sbd_bench.analysis import report
    from sbd_bench.analysis.metrics import ntp_mismatch_warning

    assert ntp_mismatch_warning(verified_records(), exact=False) is None
    records = verified_records()
    next(r for r in records if r["config"] == VFK and r["task"] == "arith")["output_ids"] = [9]
    warning = ntp_mismatch_warning(records, exact=False)
    assert warning.startswith("1 of 10 verified samples (1 configuration x task row(s)) differ") and "--exact" in warning
    assert "bug of exact mode" in ntp_mismatch_warning(records, exact=True)
    text = report.write_report(crafted_run(tmp_path / "run", records)).read_text()
    assert f"**Warning**: {warning}." in text
