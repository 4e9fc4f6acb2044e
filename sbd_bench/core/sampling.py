"""Token choice above temperature 0: HF generate's logits processing, the draw, and the speculative-sampling
rule of verified decoding. Tensor functions only; the decode loops call them (docs/decoding.md, 'Sampling').

    >>> probs = probabilities(logits, Sampling(temperature=0.7, top_p=0.9))   # (..., V)
    >>> tokens = draw(probs, uniforms)                                          # (...)

- ``process_logits`` is transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, in
  the order and with the arguments ``generate(do_sample=True)`` builds them (min_tokens_to_keep=1): the
  same tensor operations on the same (rows, V) layout, so the same ties are kept (tests/test_sampling.py
  compares them on tied logits).
- ``draw`` inverts each row's cumulative distribution at one uniform number per draw. The numbers come
  from ``DrawStream``, a CPU generator per sample: a sample's tokens depend on its seed and on its own
  logits only, not on the batch it is decoded in or on the device.
- ``speculative_verify`` is the rule of Leviathan et al. and Chen et al. (2023): accept draft x with
  probability min(1, p(x)/q(x)), at the first rejection draw from normalise(max(0, p - q)); the committed
  tokens are then distributed as NTP sampling's, provided each judged draft was drawn from a q that
  depends on nothing right of it. ``verifiable_drafts`` finds how many leading drafts satisfy that.
"""
from __future__ import annotations

import hashlib

import torch

from ..types import Sampling


# ------------------------------------------------------------------------------ the distribution
def process_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """(..., V) float logits -> the scores ``generate(do_sample=True)`` samples from, filtered tokens at -inf.
    Not for greedy sampling (temperature 0 has no distribution: the core takes the argmax)."""
    shape = logits.shape
    scores = logits.reshape(-1, shape[-1])  # (rows, V): HF's layout, so sorts break ties as HF's do
    if sampling.temperature != 1.0:  # generate adds the warper only then (x / 1.0 == x anyway)
        scores = scores / sampling.temperature
    if sampling.top_k:  # TopKLogitsWarper: drop what is below the k-th largest score; ties with it stay
        top_k = min(max(sampling.top_k, 1), scores.size(-1))
        scores = scores.masked_fill(scores < torch.topk(scores, top_k)[0][..., -1, None], float("-inf"))
    if sampling.top_p < 1.0:  # TopPLogitsWarper: drop the least likely tokens whose mass is <= 1 - top_p
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_remove = cumulative_probs <= (1 - sampling.top_p)
        sorted_remove[..., -1:] = 0  # min_tokens_to_keep = 1: the most likely token always stays
        remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.reshape(shape)


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities of the processed distribution."""
    return process_logits(logits.float(), sampling).softmax(dim=-1)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (..., V) at ``uniforms`` (...) in [0, 1): the first token whose
    cumulative probability exceeds u times the row's total (float64 sums; a token of probability 0 is
    never drawn: u < 1 in float32 leaves a gap far wider than float64 rounding)."""
    cdf = probs.double().cumsum(-1)  # (..., V)
    target = uniforms.to(cdf.device, torch.float64) * cdf[..., -1]  # (...)
    token = torch.searchsorted(cdf, target.unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    return token.clamp_max(probs.shape[-1] - 1)


# ----------------------------------------------------------------------------- random numbers
class DrawStream:
    """The uniform numbers of one sample's draws, from a CPU generator of its own. A row takes numbers
    only in the forwards it works in, the same count as at batch 1, so its draws do not depend on the
    other rows of its batch; the generator is seeded apart from the solver's (``view.generator``), so
    a randomised solver's choices and the tokens' draws are independent."""

    def __init__(self, seed: int):
        digest = hashlib.sha256(f"sbd_bench draws {seed}".encode()).digest()
        self.generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))

    def uniforms(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.generator)  # float32 in [0, 1)


def uniform_rows(streams: list[DrawStream | None], counts: list[int], device: torch.device) -> torch.Tensor:
    """(B, max(counts)) uniforms: row b's first counts[b] from streams[b], zeros after (a row without
    work, counts[b] = 0, takes none). One host-to-device copy (``to_device``)."""
    width = max(counts, default=0)
    rows = torch.zeros(len(counts), width)
    for b, (stream, n) in enumerate(zip(streams, counts)):
        if n:
            rows[b, :n] = stream.uniforms(n)
    return to_device(rows, device)


def to_device(values: torch.Tensor | list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values on ``device`` without waiting for the work queued there: on CUDA they are staged in
    pinned memory, whose copy queues behind the forward in flight (a copy from pageable memory may wait
    for it, a second synchronisation in the forward)."""
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


# ----------------------------------------------------------------------------- the verify rule
def verifiable_drafts(reveal_steps: list[int]) -> int:
    """How many leading drafts the speculative rule may judge: all of them up to the first one revealed
    in an earlier forward than a draft to its left. Such a draft's left neighbour was drawn knowing it,
    so that neighbour's acceptance depends on it, and given the accepted prefix it is no longer
    distributed as the q it was drawn from (docs/decoding.md, 'Sampling'). Drafts revealed in one forward are
    drawn independently given the block, so equal steps are fine. ``reveal_steps`` are the drafts'
    forward indices, left to right."""
    highest = -1
    for i, step in enumerate(reveal_steps):
        if step < highest:
            return i
        highest = step
    return len(reveal_steps)


def speculative_verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, verifiable: torch.Tensor,
                       accept_u: torch.Tensor, draw_u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The speculative-sampling rule over B rows of n drafts (rows with fewer are padded and have a
    smaller ``verifiable``).

    p (B, n + 1, V)  NTP's processed probabilities at each draft's position, then after the last draft
    q (B, n, V)      the processed probabilities each draft was drawn from
    drafts (B, n)    the drafted ids
    verifiable (B,)  how many leading drafts may be judged (``verifiable_drafts``; padding excluded)
    accept_u (B, n), draw_u (B,)  uniforms in [0, 1)

    Returns (accepted (B,), token (B,)): the row keeps its first ``accepted`` drafts, then ``token``, drawn
    from normalise(max(0, p - q)) at a rejected draft and from p where the judged drafts ended (all
    accepted, or the next draft may not be judged)."""
    batch, n = drafts.shape
    vocab = p.shape[-1]
    if n:
        p_x = p[:, :n].gather(-1, drafts[..., None])[..., 0]  # (B, n)
        q_x = q.gather(-1, drafts[..., None])[..., 0]
        ok = (accept_u * q_x < p_x) & (torch.arange(n, device=drafts.device) < verifiable[:, None])  # u < p/q
        accepted = ok.long().cumprod(-1).sum(-1)  # (B,) the agreeing prefix
    else:
        accepted = torch.zeros(batch, dtype=torch.long, device=drafts.device)
    rejected = accepted < verifiable  # stopped at a judged draft, not at the end of the judged ones
    p_at = p.gather(1, accepted[:, None, None].expand(-1, 1, vocab))[:, 0]  # (B, V)
    dist = p_at
    if n:
        q_at = q.gather(1, accepted.clamp_max(n - 1)[:, None, None].expand(-1, 1, vocab))[:, 0]
        residual = (p_at - q_at).clamp_min(0)
        # p == q to the last bit leaves no residual, and then no rejection either, but for float rounding
        usable = rejected & (residual.sum(-1) > 0)
        dist = torch.where(usable[:, None], residual, p_at)
    return accepted, draw(dist, draw_u)
