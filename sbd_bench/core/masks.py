"""Attention patterns of the decoding core: causal queries, then a bidirectional block; and the
additive masks that realise them over the reference cache or a preallocated one.

    >>> pattern = Pattern(n_causal=1, n_block=16)
    >>> pattern.mask(past=10, dtype=torch.float32, device="cpu").shape          # reference cache
    torch.Size([1, 1, 17, 27])
    >>> static_mask(10, 64, pattern.causal_rows("cpu"), None, torch.float32).shape   # preallocated cache
    torch.Size([1, 1, 17, 64])

0 where a query may look, the dtype's minimum where not: a boolean 4D mask would be silently ignored
by eager attention (STACK.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pattern:
    """What the queries of one forward may see, not yet a mask: ``n_causal`` causal queries followed
    by ``n_block`` bidirectional ones, and ``key_pad`` (B, past + Q) bool, True for keys no query of
    that row may see (left padding of a batched prompt, block slots past a row's context)."""

    n_causal: int
    n_block: int = 0
    key_pad: torch.Tensor | None = None

    @property
    def queries(self) -> int:
        return self.n_causal + self.n_block

    def mask(self, past: int, dtype: torch.dtype, device) -> torch.Tensor:
        """The additive mask over ``past`` cached columns and the Q new ones (reference cache)."""
        return attention_mask(past, self.n_causal, self.n_block, dtype, device, self.key_pad)

    def causal_rows(self, device) -> torch.Tensor:
        """(Q,) bool: which queries are causal, the pattern's shape without its sizes (static_mask)."""
        return torch.arange(self.queries, device=device) < self.n_causal


def attention_mask(past: int, n_causal: int, n_block: int, dtype: torch.dtype, device,
                   key_pad: torch.Tensor | None = None) -> torch.Tensor:
    """Additive mask (1, 1, Q, past + Q) for ``n_causal`` causal queries followed by ``n_block``
    bidirectional ones. Every query sees the whole cache; causal queries see earlier causal ones;
    block queries see all causal queries and the whole block; causal queries never see the block.
    (A boolean mask would be silently ignored by eager attention: STACK.md.)

    ``key_pad`` (B, past + Q) bool, True for keys no query of that row may see (left padding of a
    batched prompt, block slots past a row's context): the mask is then (B, 1, Q, past + Q)."""
    q = n_causal + n_block
    allowed = torch.ones(q, past + q, dtype=torch.bool, device=device)
    causal = torch.ones(n_causal, n_causal, dtype=torch.bool, device=device).tril()
    allowed[:n_causal, past : past + n_causal] = causal
    allowed[:n_causal, past + n_causal :] = False
    allowed = allowed[None]  # (1, Q, KV)
    if key_pad is not None:
        allowed = allowed & ~key_pad.to(device)[:, None, :]  # (B, Q, KV)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def static_mask(past: int | torch.Tensor, capacity: int, causal_rows: torch.Tensor, hidden: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor:
    """``attention_mask`` over a preallocated cache of ``capacity`` columns: (B, 1, Q, capacity), the
    columns from past + Q on blocked (they hold stale or zero keys). Built from sizes and a (Q,) pattern
    only, so it can run inside a compiled function or a CUDA graph: ``past`` may be the cache's own
    position tensor, and ``hidden`` (B, capacity) bool holds the key padding in its first past + Q columns
    (what lies beyond is never looked at)."""
    device, q = causal_rows.device, causal_rows.shape[0]
    columns = torch.arange(capacity, device=device)
    new = columns - past  # index among the Q new columns, negative for cached ones
    query = torch.arange(q, device=device)
    sees_new = (new >= 0) & (new < q) & (~causal_rows[:, None] | (new <= query[:, None]))  # (Q, C)
    allowed = ((columns < past) | sees_new)[None]  # (1, Q, C)
    if hidden is not None:
        allowed = allowed & ~hidden[:, None, :]  # (B, Q, C)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]
