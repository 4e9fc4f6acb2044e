"""Contract v2 through the core: solvers that read earlier forwards of the block (history, their own state,
the shadow) and revoke what they revealed. The history a solver sees is exactly what the core computed; a
plugin written only against types.py reads the previous forward and revokes, through `run`, verified and
not, with the same records at batch 1 and N; a solver that would cycle forever stops at the bound with the
documented outcome; contract breaks are named; the shadow at slot i is what a forward with slot i masked
predicts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from sbd_bench.conformance import check_solver, play_block
from sbd_bench.core.decoding import Decoder, SolverContractError
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry
from sbd_bench.types import BlockView, Decision, Solver, Verified, reveal_top
from tiny_models import build_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["1+2=", "12*3=", "abc", "9", "44+55-3=", "hij*hij*hij=", "c"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """Sharpened logits: the model is confident enough for several reveals per forward, and revocations."""
    path = build_tiny_model(tmp_path_factory.mktemp("sharp"), max_positions=64, sharpen=True, seed=1)
    return load_model(path, device="cpu", dtype="float32")


# A plugin as a user would write it, against the documented contract only (sbd_bench.types): it reveals the
# two most confident positions; from the second forward on it masks again each revealed position whose
# token the previous forward's distribution gave less than `keep`, and counts forwards in its state.
PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Decision, Solver, reveal_top


@dataclass(frozen=True)
class SecondThoughts(Solver):
    name: ClassVar[str] = "second_thoughts"
    description: ClassVar[str] = "two per forward; drops what the previous forward doubted"
    revokes: ClassVar[bool] = True
    keep: float = 0.5

    def select(self, view: BlockView):
        reveal = reveal_top(view.confidence, view.masked, 2)
        remask = torch.zeros_like(view.masked)
        if view.previous_logits is not None:
            before = view.previous_log_probs.exp().gather(-1, view.block.clamp_min(0)[..., None])[..., 0]
            remask = view.revealed & (before < self.keep) & (view.step % 3 == 1)  # now and then: it terminates
        count = torch.zeros_like(view.confidence) if view.state is None else view.state + 1
        return Decision(reveal=reveal, remask=remask, state=count)
'''


class Probe(Solver):
    """Records every view it gets and its answer; reveals the most confident position, and from the second
    forward of a block on masks again the oldest revealed position once (then never again in that block)."""

    name = "probe"
    revokes = True
    seen: list = []

    def select(self, view: BlockView):
        answer = self.answer(view)
        Probe.seen.append((view, answer))
        return answer

    @staticmethod
    def answer(view: BlockView) -> Decision:
        reveal = torch.zeros_like(view.masked)
        reveal[torch.arange(view.masked.shape[0]), view.confidence.masked_fill(~view.masked, -1).argmax(-1)] = True
        reveal &= view.masked
        remask = torch.zeros_like(view.masked)
        once = view.state if view.state is not None else torch.zeros(view.masked.shape, dtype=torch.long)
        fresh = once.sum(-1) == 0
        oldest = view.revealed_at.masked_fill(view.revealed_at < 0, 1 << 20).argmin(-1)
        can = view.revealed.gather(-1, oldest[:, None])[:, 0] & fresh & (view.step > 0)
        remask[torch.arange(view.masked.shape[0]), oldest] = can
        return Decision(reveal=reveal, remask=remask, state=once + remask.long())


def test_the_history_a_solver_sees_is_what_the_core_computed(lm):
    """previous_logits = the block's previous forward; revealed_at and block follow the reveals and remasks;
    state is handed back; at batch 1 and at batch 3 alike, and each row's output equals batch 1's."""
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    one, remasked = [], 0
    for prompt in prompts:
        Probe.seen = []
        one += Decoder(lm, block_size=4, max_new_tokens=8).generate_batch([prompt], Probe())
        for (before, answer), (after, _) in zip(Probe.seen, Probe.seen[1:]):
            if after.step == 0:  # a new block: no history yet
                assert after.previous_logits is None and after.state is None
                assert (after.revealed_at == -1).all() and after.masked.all()
                continue
            assert torch.equal(after.previous_logits, before.logits)
            expected_at = before.revealed_at.masked_fill(answer.reveal, before.step).masked_fill(answer.remask, -1)
            assert torch.equal(after.revealed_at, expected_at)
            assert torch.equal(after.masked, expected_at == -1)
            new = answer.reveal & ~answer.remask
            assert torch.equal(after.block[new], before.tokens[new])  # the argmax of the forward that revealed it
            assert (after.block[after.masked] == lm.mask_token_id).all()
            assert torch.equal(after.state, answer.state)
            remasked += int(answer.remask.sum())
    assert remasked > 0  # the case the comparison must cover did occur
    Probe.seen = []
    three = Decoder(lm, block_size=4, max_new_tokens=8).generate_batch(prompts, Probe())
    fields = ("output_ids", "nfe", "forwards_per_block", "remasked_per_block", "forced_per_block")
    assert [[getattr(g, f) for f in fields] for g in three] == [[getattr(g, f) for f in fields] for g in one]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sbd_bench", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_plugin_outside_the_repo_reads_the_previous_forward_and_revokes_through_run(tmp_path):
    plugins = tmp_path / "my_solvers"
    plugins.mkdir()
    (plugins / "second_thoughts.py").write_text(PLUGIN)
    records = {}
    for batch in (1, 3):
        out = tmp_path / f"b{batch}"
        done = run_cli("--plugins", str(plugins), "--solver", "second_thoughts+second_thoughts:verify=on",
                       "--task", "arith,tag", "--limit", "3", "--batch-size", str(batch), "--threads", "1",
                       "--no-cost-curve", "--no-report", "--out", str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["failures"] == 0
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        records[batch] = [{k: v for k, v in r.items() if not k.endswith("_s") and k not in ("memory", "peak_memory_bytes",
                                                                                          "peak_memory_source", "batch_size")}
                          for r in rows]
    assert records[1] == records[3]
    mine = [r for r in records[1] if r["solver"] == "second_thoughts"]
    assert mine and all(r["max_block_forwards"] == 32 for r in mine)
    assert sum(sum(r["remasked_per_block"]) for r in mine) > 0  # it did revoke
    ntp = {(r["task"], r["id"]): r["output_ids"] for r in records[1] if r["solver"] == "ntp"}
    for r in mine:
        if r["params"].get("verify") == "on":  # verified: NTP's output, whatever the drafts were
            assert r["output_ids"] == ntp[(r["task"], r["id"])]
    others = [r for r in records[1] if r["solver"] == "ntp"]
    assert all("remasked_per_block" not in r for r in others)  # records of solvers that do not revoke: as before


class Cycler(Solver):
    """Reveals the leftmost masked position and masks again every position it revealed before: it never
    finishes a block of more than one slot by itself."""

    name = "cycler"
    revokes = True

    def select(self, view):
        slot = torch.arange(view.k).expand_as(view.masked)
        leftmost = slot.masked_fill(~view.masked, view.k).argmin(-1, keepdim=True)
        return Decision(reveal=(slot == leftmost) & view.masked, remask=view.revealed)


@pytest.mark.parametrize("bound", [4, 7])
def test_a_solver_that_would_cycle_forever_stops_at_the_bound(lm, bound):
    """At the block's bound-th forward every position still masked is revealed from that forward's logits:
    blocks take exactly `bound` forwards, forced_per_block counts what the core revealed; verified, NTP's."""
    prompt = lm.tokenizer("44+55-3=")["input_ids"]
    decoder = Decoder(lm, block_size=4, max_new_tokens=8, max_block_forwards=bound)
    gen = decoder.generate(prompt, Cycler())
    assert gen.forwards_per_block == [bound, bound] and gen.nfe == 2 * bound
    # before the last forward one slot is revealed and three masked; there the solver reveals one more and the
    # core the other two; every forward between the first and the last masked one slot again
    assert gen.forced_per_block == [2, 2] and gen.remasked_per_block == [bound - 2, bound - 2]
    assert len(gen.output_ids) == 8 and sum(gen.revealed_per_forward) == 8 and len(gen.revealed_per_forward) == gen.nfe
    ntp = decoder.generate(prompt, parse_solver_spec("ntp", solver_registry())[0])
    assert decoder.generate(prompt, Verified(Cycler())).output_ids == ntp.output_ids


def test_the_bound_must_leave_a_block_its_k_forwards(lm):
    from sbd_bench.core.decoding import DecodeError

    with pytest.raises(DecodeError, match="--max-block-forwards must be at least the block size 4"):
        Decoder(lm, block_size=4, max_block_forwards=3)


@dataclass(frozen=True)
class Bad(Solver):
    name: ClassVar[str] = "bad"
    revokes: ClassVar[bool] = True
    what: str = ""

    def select(self, view):
        reveal = view.masked & (torch.arange(view.k) == view.masked.float().argmax(-1, keepdim=True))
        remask = torch.zeros_like(view.masked)
        if self.what == "masked" and view.step == 1:
            remask = view.masked & ~reveal  # a position still masked
        if self.what == "same" and view.step == 1:
            remask = reveal  # the one it reveals now
        if self.what == "core" and view.step == 0 and not view.masked[0, 0]:
            remask[:, 0] = True  # verified mode's first slot: NTP's token
        return Decision(reveal=reveal, remask=remask)


@pytest.mark.parametrize("what, verified", [("masked", False), ("same", False), ("core", True)])
def test_revoking_what_it_did_not_reveal_is_a_named_contract_error(lm, what, verified):
    solver = Verified(Bad(what)) if verified else Bad(what)
    with pytest.raises(SolverContractError, match="masked again a position it had not revealed in an earlier forward"):
        Decoder(lm, block_size=4, max_new_tokens=8).generate(lm.tokenizer("1+2=")["input_ids"], solver)


class Undeclared(Solver):
    name = "undeclared"

    def select(self, view):
        return Decision(reveal=view.masked, remask=torch.zeros_like(view.masked))


def test_a_remask_without_the_class_flag_is_refused(lm):
    with pytest.raises(SolverContractError, match="without revokes = True"):
        Decoder(lm, block_size=4, max_new_tokens=4).generate(lm.tokenizer("1+2=")["input_ids"], Undeclared())


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("one-layer"), max_positions=64, sharpen=True, seed=1, layers=1)
    return load_model(path, device="cpu", dtype="float32")


@pytest.mark.parametrize("layers", [1, 2])
def test_the_shadow_of_a_slot_is_a_masked_query_that_sees_the_other_slots(lm, one_layer, layers):
    """Shadow query i is a mask token at slot i that sees the cache and every other slot of the block. At a
    masked slot it predicts what the block's own query does. At a revealed slot, in a one-layer model, it is
    exactly the forward with slot i masked; with more layers the other slots' states, which saw token i in
    earlier layers, carry some of it (as in WINO's shadow block; docs/decoding.md, 'Revocation')."""
    from sbd_bench.core.cache import KVCache

    model = one_layer if layers == 1 else lm
    decoder = Decoder(model, block_size=4)
    prompt = torch.tensor([model.tokenizer("44+55-3=")["input_ids"]])
    mask = model.mask_token_id
    block = torch.tensor([[model.tokenizer("7")["input_ids"][-1], mask, model.tokenizer("x")["input_ids"][-1], mask]])
    cache = KVCache(model.model.config)
    decoder.prefill(prompt[:, :-1], cache)
    start = prompt.shape[1]
    both = decoder.block_step(prompt[:, -1:], block, start, cache, shadow=True)  # (1, 8, V)
    assert cache.length == prompt.shape[1]  # the block and its shadow were rolled back, the carried token kept
    main, shadow = both[:, :4], both[:, 4:]
    plain = decoder.block_step(prompt[:, :0], block, start, cache)
    assert torch.allclose(main, plain, atol=1e-5)  # the block's own queries never see the shadow
    for i in (1, 3):  # masked slots: the shadow query sees what the block's own query sees
        assert torch.allclose(shadow[0, i], main[0, i], atol=1e-5)
    for i in (0, 2):  # revealed slots
        alone = block.clone()
        alone[0, i] = mask
        reference = decoder.block_step(prompt[:, :0], alone, start, cache)[0, i]
        close = torch.allclose(shadow[0, i], reference, atol=1e-5)
        assert close == (layers == 1), (i, layers)
        other = block.clone()  # and the shadow of slot i does not read token i itself: another token there
        other[0, i] = model.tokenizer("q")["input_ids"][-1]
        moved = decoder.block_step(prompt[:, :0], other, start, cache, shadow=True)[0, 4 + i]
        assert torch.allclose(moved, shadow[0, i], atol=1e-5) == (layers == 1)


@pytest.mark.parametrize("fast", [False, True])
def test_wino_revokes_and_verified_wino_is_ntp(lm, fast):
    """WINO drafting wide (tau_in 0) and keeping only what the shadow is sure of (tau_out 1) revokes in every
    block; through the fast path's static cache too; verified, its output is NTP's."""
    ntp, wino, verified = parse_solver_spec("wino:tau_in=0.0;tau_out=1.0;verify=off,on", solver_registry())
    decoder = Decoder(lm, block_size=8, max_new_tokens=16, fast=fast, compile=False)
    remasked = 0
    for prompt in (lm.tokenizer(p)["input_ids"] for p in PROMPTS):
        assert decoder.generate(prompt, verified).output_ids == decoder.generate(prompt, ntp).output_ids
        remasked += sum(decoder.generate(prompt, wino).remasked_per_block)
    assert remasked > 0


# ------------------------------------------------------------------------------ the conformance kit
class RevokesWhatIsMasked(Solver):
    name, revokes = "revokes_masked", True

    def select(self, view):
        first = torch.zeros_like(view.masked)
        first[:, 0] = True
        return Decision(reveal=view.masked & ~first | (view.masked & first & (view.masked.sum(-1, keepdim=True) == 1)),
                        remask=view.masked & first)


class ReadsWithoutAsking(Solver):
    name = "reads_without_asking"

    def select(self, view):
        return view.masked & ~view.revealed


class CyclesForever(Cycler):
    name = "cycles_forever"


class NeverRevokes(Solver):  # says it revokes, judges by the shadow, but its threshold can never be met
    name, revokes, reads_shadow = "never_revokes", True, True

    def select(self, view):
        reveal = reveal_top(view.confidence, view.masked, 1)
        if view.shadow_logits is None:
            return reveal
        return Decision(reveal=reveal, remask=view.revealed & (view.shadow_confidence < 0.0))


@pytest.mark.parametrize("solver, broken", [
    (RevokesWhatIsMasked(), "masked again a position it had not revealed"),
    (ReadsWithoutAsking(), "NoneType|'>=' not supported|unsupported"),
    (CyclesForever(), "did not finish a block of 8 positions within 2k = 16 forwards"),
    (NeverRevokes(), "revokes = True, yet it masked nothing again in a block built to need it"),
])
def test_the_kit_fails_solvers_that_break_the_new_rules(solver, broken):
    with pytest.raises((AssertionError, TypeError, AttributeError), match=broken):
        check_solver(solver)


def test_play_block_hands_a_history_solver_its_previous_forward_and_state():
    """The kit's block player is the core's loop in miniature: previous_logits is the last forward's, the
    state comes back, a remask reopens the slot."""
    logits = [torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(s)) for s in range(8)]
    shadows = [torch.zeros(1, 4, 6)] * 8
    forwards = play_block(Probe(), logits, shadows)
    for t, f in enumerate(forwards[1:], start=1):
        assert torch.equal(f.view.previous_logits, logits[t - 1])
    assert sum(int(f.remask.sum()) for f in forwards) == 1  # the probe revokes once per block
    assert len(forwards) == 5  # 4 slots, one revealed twice
