"""Attention patterns of the decoding core: causal queries, then a bidirectional block, then optionally
the block's shadow; and the additive masks that realise them over the reference cache or a preallocated one.

    >>> pattern = Pattern(n_causal=1, n_block=16)
    >>> pattern.mask(past=10, dtype=torch.float32, device="cpu").shape          # reference cache
    torch.Size([1, 1, 17, 27])
    >>> static_mask(10, 64, pattern.kinds("cpu"), None, torch.float32).shape   # preallocated cache
    torch.Size([1, 1, 17, 64])

The shadow (``n_shadow`` = ``n_block`` queries, all mask tokens at the block's positions) gives, at slot i,
what a masked query at i predicts when it sees every other slot of the block as it is: the view SBD
training gives a masked slot, so the one trained opinion of a revealed token (revoking solvers read it;
docs/decoding.md, 'Revocation'). Shadow query i sees the cache, the causal queries, every block slot but i,
and itself; no other query sees a shadow key.

0 where a query may look, the dtype's minimum where not: a boolean 4D mask would be silently ignored
by eager attention (STACK.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class Pattern:
    """What the queries of one forward may see, not yet a mask: ``n_causal`` causal queries followed
    by ``n_block`` bidirectional ones, and ``key_pad`` (B, past + Q) bool, True for keys no query of
    that row may see (left padding of a batched prompt, block slots past a row's context)."""

    n_causal: int
    n_block: int = 0
    key_pad: torch.Tensor | None = None
    shadow: bool = False  # n_block shadow queries follow the block

    @property
    def queries(self) -> int:
        return self.n_causal + self.n_block * (2 if self.shadow else 1)

    def mask(self, past: int, dtype: torch.dtype, device) -> torch.Tensor:
        """The additive mask over ``past`` cached columns and the Q new ones (reference cache). Without key
        padding (always at batch 1) it depends on the sizes only, so one is built per shape and shared: a
        block's forwards after its first have one shape (never written to: attention only reads it)."""
        if self.key_pad is None:
            return _shared_mask(past, self.n_causal, self.n_block, dtype, torch.device(device), self.shadow)
        return attention_mask(past, self.n_causal, self.n_block, dtype, device, self.key_pad, self.shadow)

    def kinds(self, device) -> torch.Tensor:
        """(Q,) long: the pattern's shape without its sizes (``static_mask``): 1 for a causal query, 0 for a
        block query, 2 + i for the shadow query of block slot i."""
        kinds = (torch.arange(self.n_causal + self.n_block, device=device) < self.n_causal).long()
        if self.shadow:
            kinds = torch.cat([kinds, 2 + torch.arange(self.n_block, device=device)])
        return kinds


def attention_mask(past: int, n_causal: int, n_block: int, dtype: torch.dtype, device,
                   key_pad: torch.Tensor | None = None, shadow: bool = False) -> torch.Tensor:
    """Additive mask (1, 1, Q, past + Q) for ``n_causal`` causal queries followed by ``n_block``
    bidirectional ones (and, with ``shadow``, ``n_block`` shadow queries). Every query sees the whole
    cache; causal queries see earlier causal ones; block queries see all causal queries and the whole
    block; causal queries never see the block; shadow query i sees the causal queries, the block but its
    slot i, and itself. (A boolean mask would be silently ignored by eager attention: STACK.md.)

    ``key_pad`` (B, past + Q) bool, True for keys no query of that row may see (left padding of a
    batched prompt, block slots past a row's context): the mask is then (B, 1, Q, past + Q)."""
    q = n_causal + n_block * (2 if shadow else 1)
    allowed = torch.ones(q, past + q, dtype=torch.bool, device=device)
    causal = torch.ones(n_causal, n_causal, dtype=torch.bool, device=device).tril()
    allowed[:n_causal, past : past + n_causal] = causal
    allowed[:n_causal, past + n_causal :] = False
    if shadow:
        block_end = past + n_causal + n_block
        allowed[n_causal : n_causal + n_block, block_end:] = False  # no block query sees the shadow
        others = ~torch.eye(n_block, dtype=torch.bool, device=device)
        allowed[n_causal + n_block :, past + n_causal : block_end] = others  # the block but the own slot
        allowed[n_causal + n_block :, block_end:] = ~others  # itself only, among the shadow
    allowed = allowed[None]  # (1, Q, KV)
    if key_pad is not None:
        allowed = allowed & ~key_pad.to(device)[:, None, :]  # (B, Q, KV)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


@lru_cache(maxsize=8)
def _shared_mask(past: int, n_causal: int, n_block: int, dtype: torch.dtype, device: torch.device,
                 shadow: bool) -> torch.Tensor:
    return attention_mask(past, n_causal, n_block, dtype, device, None, shadow)


def static_mask(past: int | torch.Tensor, capacity: int, kinds: torch.Tensor, hidden: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor:
    """``attention_mask`` over a preallocated cache of ``capacity`` columns: (B, 1, Q, capacity), the
    columns from past + Q on blocked (they hold stale or zero keys). Built from sizes and the (Q,) pattern
    ``kinds`` (``Pattern.kinds``) only, so it can run inside a compiled function or a CUDA graph: ``past``
    may be the cache's own position tensor, and ``hidden`` (B, capacity) bool holds the key padding in its
    first past + Q columns (what lies beyond is never looked at)."""
    device, q = kinds.device, kinds.shape[0]
    columns = torch.arange(capacity, device=device)
    new = columns - past  # index among the Q new columns, negative for cached ones
    query = torch.arange(q, device=device)[:, None]
    column_kind = kinds[new.clamp(0, q - 1)]  # (C,)
    causal_key, block_key = column_kind == 1, column_kind == 0
    slot = new - (kinds == 1).sum()  # a block key's slot
    kind = kinds[:, None]  # (Q, 1)
    sees_new = ((kind == 1) & causal_key & (new <= query)) \
        | ((kind == 0) & (causal_key | block_key)) \
        | ((kind >= 2) & (causal_key | (block_key & (slot != kind - 2)) | (new == query)))
    sees_new = sees_new & (new >= 0) & (new < q)  # (Q, C)
    allowed = ((columns < past) | sees_new)[None]  # (1, Q, C)
    if hidden is not None:
        allowed = allowed & ~hidden[:, None, :]  # (B, Q, C)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]
