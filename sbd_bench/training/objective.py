"""The SBD training objective (SBD.md §2), one step with one block size k ~ U{kmin..kmax}:

  input       [x_1..x_L | x̂_1..x̂_L], both halves with position ids 0..L-1; x̂_i is the mask token
              with probability η, η ~ U(0,1) drawn per sequence
  blocks      block(p) = floor((p - c) / k), c = where the completion starts: blocks line up with
              the completion as they do at inference; the last block is padded to k with pad targets
              after EOS (at inference it holds masked slots past EOS)
  attention   clean->clean causal; noisy->noisy same block, both ways; noisy->clean strictly earlier
              blocks; clean->noisy never. An additive float mask (a boolean one is ignored by eager
              attention, STACK.md)
  loss        next-token CE on the clean half (completion targets only: prompt tokens carry no loss)
              plus CE on the masked positions of the noisy half (unshifted), as ONE token-mean over
              both label sets: sum(CE) / (#NTP targets + #masked targets). No weights, no 1/η.

    >>> batch = make_batch(pairs, [0, 1], k=4, objective="sbd", generator=g, pad_id=0, mask_id=4)
    >>> loss, *_ = losses(model, batch, "cpu")
"""
from __future__ import annotations

import math
from dataclasses import dataclass

IGNORE = -100  # label of positions that carry no loss


def block_ids(length: int, completion_start, k: int):
    """(B, L) block index of each position; blocks start at the completion start (negative in the
    prompt). ``completion_start`` is a (B,) tensor."""
    import torch

    pos = torch.arange(length, device=completion_start.device)[None]  # (1, L)
    return torch.div(pos - completion_start[:, None], k, rounding_mode="floor")


def sbd_attention_allowed(length: int, completion_start, k: int):
    """(B, 2L, 2L) bool: which key each query of the two-copy input may attend to (SBD.md §2)."""
    import torch

    blk = block_ids(length, completion_start, k)  # (B, L)
    B, L = blk.shape
    q_blk, k_blk = blk[:, :, None], blk[:, None, :]  # (B, L, 1), (B, 1, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=blk.device).tril().expand(B, L, L)
    allowed = torch.zeros(B, 2 * L, 2 * L, dtype=torch.bool, device=blk.device)
    allowed[:, :L, :L] = causal  # clean -> clean
    allowed[:, L:, L:] = q_blk == k_blk  # noisy -> noisy: same block, both ways
    allowed[:, L:, :L] = k_blk < q_blk  # noisy -> clean: strictly earlier blocks
    return allowed  # clean -> noisy stays False


def additive_mask(allowed, dtype):
    """bool (B, Q, K) -> float (B, 1, Q, K): 0 where allowed, the dtype's minimum elsewhere."""
    import torch

    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


@dataclass
class Batch:
    """One step's tensors. ``ids`` (B, L) clean sequences, right-padded; ``ntp_labels`` (B, L) the
    next-token target of each position or -100; for SBD, ``noisy`` (B, L) the second copy,
    ``matp_labels`` (B, L) the target at each masked position or -100, ``mask`` (B, 1, 2L, 2L)."""

    ids: object
    ntp_labels: object
    k: int
    noisy: object = None
    matp_labels: object = None
    mask: object = None
    tokens: int = 0  # real (unpadded) tokens in the clean half: the throughput unit
    starts: tuple = ()  # each row's completion start (blocks line up with it)
    lengths: tuple = ()  # each row's real length (prompt + completion)
    padded_ends: tuple = ()  # each row's end with its last block padded to k

    def label_count(self) -> int:
        """Positions that carry a loss, both halves: the denominator of the one token-mean."""
        count = int((self.ntp_labels != IGNORE).sum())
        return count + (int((self.matp_labels != IGNORE).sum()) if self.matp_labels is not None else 0)

    def rows(self, start: int, stop: int, mask_dtype=None) -> "Batch":
        """Rows start..stop-1 (a rank's slice of a micro-batch), cut to their own longest padded row,
        with their attention mask. The rows' labels, masked positions and k are the step's own, so
        the step's examples do not depend on how many ranks share it."""
        import torch

        L = max(self.padded_ends[start:stop])
        # cut positions hold padding only: every target of a kept position lies before its row's end
        part = Batch(ids=self.ids[start:stop, :L], ntp_labels=self.ntp_labels[start:stop, :L], k=self.k,
                     tokens=sum(self.lengths[start:stop]), starts=self.starts[start:stop],
                     lengths=self.lengths[start:stop], padded_ends=self.padded_ends[start:stop])
        if self.noisy is not None:
            part.noisy = self.noisy[start:stop, :L]
            part.matp_labels = self.matp_labels[start:stop, :L]
            allowed = sbd_attention_allowed(L, torch.tensor(part.starts), self.k)
            part.mask = additive_mask(allowed, mask_dtype or torch.float32)
        return part


def make_batch(pairs, indices, k: int, objective: str, generator, pad_id: int, mask_id: int, dtype=None,
               with_mask: bool = True):
    """Build a batch from (prompt_ids, completion_ids) pairs; completions already end with EOS.
    ``with_mask=False`` leaves the (B, 1, 2L, 2L) attention mask to ``Batch.rows`` (per slice)."""
    import torch

    dtype = dtype or torch.float32
    rows, starts, ends, padded_ends = [], [], [], []
    for i in indices:
        prompt, completion = pairs[i]
        c, n = len(prompt), len(completion)
        rows.append(list(prompt) + list(completion))
        starts.append(c)
        ends.append(c + n)
        padded_ends.append(c + math.ceil(n / k) * k)  # the last block, padded with pad targets
    L = max(padded_ends)
    B = len(rows)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    pos = torch.arange(L)[None]  # (1, L)
    start, end, pend = (torch.tensor(v)[:, None] for v in (starts, ends, padded_ends))  # (B, 1) each
    # clean half: logit t predicts token t+1, for completion tokens only (EOS included)
    ntp_labels = torch.full((B, L), IGNORE, dtype=torch.long)
    target_pos = pos + 1
    has_target = (target_pos >= start) & (target_pos < end)
    ntp_labels[:, :-1] = torch.where(has_target[:, :-1], ids[:, 1:], IGNORE)
    batch = Batch(ids=ids, ntp_labels=ntp_labels, k=k, tokens=sum(ends),
                  starts=tuple(starts), lengths=tuple(ends), padded_ends=tuple(padded_ends))
    if objective == "ntp":
        return batch
    eta = torch.rand(B, 1, generator=generator)  # one mask ratio per sequence
    in_blocks = (pos >= start) & (pos < pend)
    masked = (torch.rand(B, L, generator=generator) < eta) & in_blocks
    batch.noisy = torch.where(masked, mask_id, ids)
    batch.matp_labels = torch.where(masked, ids, IGNORE)  # unshifted; pad targets after EOS
    if with_mask:
        batch.mask = additive_mask(sbd_attention_allowed(L, torch.tensor(starts), k), dtype)
    return batch


def sbd_inputs(batch: Batch):
    """Two-copy input ids (B, 2L) and position ids (B, 2L): both halves at 0..L-1."""
    import torch

    B, L = batch.ids.shape
    ids = torch.cat([batch.ids, batch.noisy], dim=1)
    positions = torch.arange(L).repeat(2)[None].expand(B, -1)
    return ids, positions


def losses(model, batch: Batch, device, denominator: float | None = None):
    """Returns (loss, ntp_sum, ntp_count, matp_sum, matp_count); loss is the one token-mean, or the
    batch's CE sum over ``denominator`` (a slice of a step: the step's label count, so that the
    slices' losses add up to the step's token-mean)."""
    import torch
    import torch.nn.functional as F

    L = batch.ids.shape[1]
    if batch.noisy is None:
        logits = model(input_ids=batch.ids.to(device)).logits  # plain causal
        labels = batch.ntp_labels.to(device)
    else:
        ids, positions = sbd_inputs(batch)
        logits = model(input_ids=ids.to(device), position_ids=positions.to(device),
                       attention_mask=batch.mask.to(device)).logits  # (B, 2L, V)
        labels = torch.cat([batch.ntp_labels, batch.matp_labels], dim=1).to(device)
    ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                         reduction="none").view(labels.shape)
    valid = labels != IGNORE
    ntp_sum, ntp_count = ce[:, :L].sum(), valid[:, :L].sum()
    matp_sum, matp_count = ce[:, L:].sum(), valid[:, L:].sum()
    count = (ntp_count + matp_count).clamp_min(1) if denominator is None else denominator
    loss = (ntp_sum + matp_sum) / count
    return loss, ntp_sum.detach(), int(ntp_count), matp_sum.detach(), int(matp_count)
