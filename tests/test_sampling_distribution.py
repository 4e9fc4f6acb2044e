"""Sampling end to end, as distributions: on a random Llama with a 9-token vocabulary, the joint distribution
of the first three generated tokens at temperature 0.7, top-p 0.9 is computed exactly (NTP's processed
probabilities, by transformers' own warpers) and every sampler is tested against it with Pearson's
chi-square over 20,000 draws: HF ``generate(do_sample=True)``, the core's NTP sampling, and verified
sampling with entropy-bounded and right-to-left drafts, at batch 20,000 and (NTP) batch 1. The draws are
seeded, so every p-value is fixed; each must exceed 0.01.

The same enumeration computes exactly what verified sampling would commit if out-of-order drafts were
judged without truncation (core/sampling.py, ``verifiable_drafts``): not NTP's distribution, and the
test's power against that bias is checked by drawing from it."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import ClassVar

import pytest
import torch

from chisquare import goodness_of_fit, homogeneity
from test_sampling import hf_processed
from tiny_models import build_tiny_model
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.masks import attention_mask
from sbd_bench.core.model import load_model
from sbd_bench.registry import solver_registry
from sbd_bench.types import BlockView, Decision, Sampling, Solver, Verified, reveal_top, sampled

NTP, EntropyBounded = solver_registry()["ntp"], solver_registry()["entropy_bounded"]

pytestmark = pytest.mark.usefixtures("one_thread")

DRAWS = 20_000
SAMPLING = Sampling(temperature=0.7, top_p=0.9)
PROMPT = "abca"
ALPHA = 0.01


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """LM head x10: neither near-greedy nor near-uniform, so drafts and NTP disagree often. Stop tokens
    are cleared (as in scripts/ntp_vs_generate.py): every sample has three tokens."""
    folder = build_tiny_model(tmp_path_factory.mktemp("sampling") / "abcd", seed=0, alphabet="abcd", sharpen=10.0)
    return dataclasses.replace(load_model(str(folder), device="cpu", dtype="float32"), stop_token_ids=())


@pytest.fixture(scope="module")
def prompt(lm):
    return lm.tokenizer(PROMPT)["input_ids"]


# ------------------------------------------------------------------------- exact distributions
@torch.inference_mode()
def _probs(lm, rows: list[list[int]], n_block: int = 0) -> torch.Tensor:
    """(B, L, V) float64 processed probabilities of full sequences (no cache): causal, or with the last
    ``n_block`` positions one bidirectional block (SBD's MATP reading; its logit i predicts token i)."""
    ids = torch.tensor(rows)
    length = ids.shape[1]
    mask = attention_mask(0, length - n_block, n_block, torch.float32, "cpu") if n_block else None
    logits = lm.model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(length)[None].expand_as(ids)).logits
    logits = logits.float()
    logits[..., lm.mask_token_id] = float("-inf")  # the core never emits the mask token (generate: suppress_tokens)
    vocab = logits.shape[-1]
    probs = hf_processed(logits.reshape(-1, vocab), SAMPLING).softmax(-1).reshape(logits.shape).double()
    return probs / probs.sum(-1, keepdim=True)  # sums of 1 in float64: the enumeration's identities then hold to 1e-15


def ntp_tables(lm, prompt):
    """p0 (V,), p1 (V, V), p2 (V, V, V): NTP's processed next-token probabilities after the prompt, after
    prompt + a, after prompt + a b."""
    vocab = lm.model.config.vocab_size
    p0 = _probs(lm, [prompt])[0, -1]
    p1 = _probs(lm, [prompt + [a] for a in range(vocab)])[:, -1]
    p2 = _probs(lm, [prompt + [a, b] for a in range(vocab) for b in range(vocab)])[:, -1].reshape(vocab, vocab, vocab)
    return p0, p1, p2


def exact_joint(lm, prompt) -> torch.Tensor:
    p0, p1, p2 = ntp_tables(lm, prompt)
    return p0[:, None, None] * p1[:, :, None] * p2  # (V, V, V)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-300), p)


def right_to_left_verified_joint(lm, prompt, truncate: bool) -> torch.Tensor:
    """Exactly what verified sampling commits first with blocks of 3 drafted right to left: NTP samples
    position 0 (a ~ p0) while the block's first forward reveals position 2 (c ~ q3, all masked), the
    next reveals position 1 (b ~ q2(. | a, c)); the next block's first forward judges b, then c.
    Judging c is what truncation forbids: c was drawn before b, and b's acceptance depends on c."""
    p0, p1, p2 = ntp_tables(lm, prompt)
    vocab, mask = p0.shape[0], lm.mask_token_id
    q3 = _probs(lm, [prompt + [mask, mask, mask]], n_block=3)[0, -1]
    q2 = _probs(lm, [prompt + [a, mask, c] for a in range(vocab) for c in range(vocab)], n_block=3)[:, -2]
    q2 = q2.reshape(vocab, vocab, vocab)  # [a, c, b]
    out = torch.zeros(vocab, vocab, vocab, dtype=torch.float64)
    for a in range(vocab):
        for c in range(vocab):
            weight = p0[a] * q3[c]
            if weight == 0:
                continue
            kept = torch.minimum(q2[a, c], p1[a])  # P(b drafted and accepted) = min(q, p) for each b
            rejected = 1 - kept.sum()
            out[a] += weight * rejected * _residual(p1[a], q2[a, c])[:, None] * p2[a]  # y2 from the residual
            for b in range(vocab):
                if kept[b] == 0:
                    continue
                if truncate:  # c may not be judged: NTP samples position 2
                    out[a, b] += weight * kept[b] * p2[a, b]
                else:
                    accept = torch.clamp(p2[a, b, c] / q3[c], max=1.0)
                    out[a, b, c] += weight * kept[b] * accept
                    out[a, b] += weight * kept[b] * (1 - accept) * _residual(p2[a, b], q3)
    return out


def as_cells(joint: torch.Tensor) -> dict:
    vocab = joint.shape[0]
    return {(a, b, c): float(joint[a, b, c]) for a in range(vocab) for b in range(vocab) for c in range(vocab)
            if joint[a, b, c] > 0}


# --------------------------------------------------------------------------------------- samplers
@torch.inference_mode()
def hf_generate_draws(lm, prompt, n: int = DRAWS, seed: int = 0) -> Counter:
    torch.manual_seed(seed)  # generate draws from torch's global generator
    ids = torch.tensor([prompt]).expand(n, -1)
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                            temperature=SAMPLING.temperature, top_p=SAMPLING.top_p, max_new_tokens=3,
                            min_new_tokens=3, eos_token_id=None, pad_token_id=lm.tokenizer.pad_token_id,
                            suppress_tokens=[lm.mask_token_id])  # top_k: generate's 50 > V keeps every token
    return Counter(map(tuple, out[:, len(prompt):].tolist()))


@pytest.fixture(scope="module")
def hf_draws(lm, prompt) -> Counter:
    return hf_generate_draws(lm, prompt)


# ------------------------------------------------------------------------------------------ tests
def test_the_exact_distribution_is_what_hf_generate_samples(lm, prompt, hf_draws):
    joint = exact_joint(lm, prompt)
    assert abs(float(joint.sum()) - 1) < 1e-12
    cells = as_cells(joint)
    assert 50 <= len(cells) <= 400  # enough cells for the test to see a bias, few enough for 20,000 draws
    statistic, df, p = goodness_of_fit(hf_draws, cells)
    print(f"HF generate against the exact distribution: chi2 {statistic:.1f}, df {df}, p {p:.3f}")
    assert p > ALPHA


def test_unordered_drafts_need_truncation_and_the_test_sees_it(lm, prompt):
    exact = exact_joint(lm, prompt)
    truncated = right_to_left_verified_joint(lm, prompt, truncate=True)
    untruncated = right_to_left_verified_joint(lm, prompt, truncate=False)
    assert float((truncated - exact).abs().max()) < 1e-12  # exact, to rounding
    distance = 0.5 * float((untruncated - exact).abs().sum())
    assert distance > 0.01  # total variation: judging c after b biases the output
    generator = torch.Generator().manual_seed(0)
    flat = torch.multinomial(untruncated.flatten().float(), DRAWS, replacement=True, generator=generator)
    vocab = exact.shape[0]
    biased = Counter((int(i) // vocab // vocab, int(i) // vocab % vocab, int(i) % vocab) for i in flat)
    statistic, df, p = goodness_of_fit(biased, as_cells(exact))
    print(f"untruncated verified sampling: TV {distance:.4f}; {DRAWS} draws from it: chi2 {statistic:.1f}, df {df}, "
          f"p {p:.2e}")
    assert p < 1e-6


def test_homogeneity_of_two_generate_runs(lm, prompt):
    """The two-sample test the core's draws are compared with generate's by: two seeds of generate agree."""
    statistic, df, p = homogeneity(hf_generate_draws(lm, prompt, seed=1), hf_generate_draws(lm, prompt, seed=2))
    assert p > ALPHA, (statistic, df, p)


# ------------------------------------------------------------------------------------ the core's
@dataclasses.dataclass(frozen=True)
class RightToLeft(Solver):
    """Test-only: the rightmost masked position each forward, so every draft after the first is drawn
    knowing a draft to its right (the order that needs truncation)."""

    name: ClassVar[str] = "right_to_left"

    def select(self, view: BlockView) -> torch.Tensor:
        rightness = torch.arange(view.k, dtype=torch.float32, device=view.masked.device).expand(view.masked.shape)
        return reveal_top(rightness, view.masked, 1)


def core_draws(lm, prompt, solver, n: int = DRAWS, first_seed: int = 0, block_size: int = 3) -> list[tuple]:
    """The first three tokens of n samples (seeds first_seed, first_seed + 1, ...), decoded as one batch."""
    decoder = Decoder(lm, block_size=block_size, max_new_tokens=3)
    gens = decoder.generate_batch([prompt] * n, sampled(solver, SAMPLING), seeds=range(first_seed, first_seed + n))
    return [tuple(g.output_ids) for g in gens]


@dataclasses.dataclass(frozen=True)
class Doubter(Solver):
    """Test-only: the leftmost masked position each forward; from the second forward on, each position
    revealed earlier whose token the shadow gives less than 0.4 is masked again, once per position. Which
    drafts survive depends on their values: the case that only the block's last forward's drafts may be
    judged (verify.judgeable)."""

    name: ClassVar[str] = "doubter"
    revokes: ClassVar[bool] = True
    reads_shadow: ClassVar[bool] = True

    def select(self, view: BlockView):
        leftness = -torch.arange(view.k, dtype=torch.float32).expand(view.masked.shape)
        reveal = reveal_top(leftness, view.masked, 1)
        doubted = torch.zeros_like(view.masked) if view.state is None else view.state
        remask = torch.zeros_like(view.masked)
        if view.shadow_logits is not None:
            remask = view.revealed & (view.shadow_confidence < 0.4) & ~doubted
        return Decision(reveal=reveal, remask=remask, state=doubted | remask)


CONFIGS = {"ntp": NTP(), "entropy_bounded verified": Verified(EntropyBounded()),
           "right_to_left verified": Verified(RightToLeft()), "doubter verified": Verified(Doubter())}
BLOCK_SIZES = {"doubter verified": 4}  # three drafts a block: room to reveal, doubt and reveal again


@pytest.fixture(scope="module")
def core_samples(lm, prompt):
    return {name: core_draws(lm, prompt, solver, block_size=BLOCK_SIZES.get(name, 3)) for name, solver in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_cores_sampling_matches_the_exact_distribution_and_generate(name, lm, prompt, core_samples, hf_draws):
    draws = Counter(core_samples[name])
    assert sum(draws.values()) == DRAWS and all(len(cell) == 3 for cell in draws)
    statistic, df, p = goodness_of_fit(draws, as_cells(exact_joint(lm, prompt)))
    two = homogeneity(draws, hf_draws)
    print(f"{name}: against the exact distribution chi2 {statistic:.1f}, df {df}, p {p:.3f}; against generate's "
          f"draws chi2 {two[0]:.1f}, df {two[1]}, p {two[2]:.3f}")
    assert p > ALPHA and two[2] > ALPHA


def test_the_revoking_configuration_revokes(lm, prompt):
    decoder = Decoder(lm, block_size=4, max_new_tokens=3)
    gens = decoder.generate_batch([prompt] * 50, sampled(CONFIGS["doubter verified"], SAMPLING), seeds=range(50))
    assert sum(sum(g.remasked_per_block) for g in gens) > 0


def test_a_samples_tokens_depend_on_its_seed_only(lm, prompt, core_samples):
    """Batch 1, or a row of 20,000: the same tokens (every configuration, 40 seeds)."""
    for name, solver in CONFIGS.items():
        alone = [core_draws(lm, prompt, solver, n=1, first_seed=seed, block_size=BLOCK_SIZES.get(name, 3))[0]
                 for seed in range(0, DRAWS, DRAWS // 40)]
        assert alone == core_samples[name][:: DRAWS // 40], name


def test_a_revoking_solvers_early_drafts_judged_are_biased_and_the_test_sees_it(lm, prompt, monkeypatch):
    """The doubter's drafts judged by the plain rule (every draft up to the first revealed before one to its
    left), not only those of the block's last forward: which drafts survive depended on their values, and
    the output is far from NTP's distribution (chi-square 2,313 on 98 df at 40,000 draws when measured; 375 on
    88 df, p 5e-37, at the 5,000 drawn here)."""
    from sbd_bench.core import verify
    from sbd_bench.core.sampling import verifiable_drafts

    monkeypatch.setattr(verify, "judgeable", lambda solver, r: verifiable_drafts(r.reveal_step[1 : len(r.pending)]))
    draws = Counter(core_draws(lm, prompt, CONFIGS["doubter verified"], n=DRAWS // 4,  # a quarter: power to spare
                               block_size=BLOCK_SIZES["doubter verified"]))
    statistic, df, p = goodness_of_fit(draws, as_cells(exact_joint(lm, prompt)))
    print(f"doubter verified, early drafts judged: chi2 {statistic:.1f}, df {df}, p {p:.2e}")
    assert p < 1e-6
