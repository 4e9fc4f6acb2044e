"""Additive attention masks for the decoding core: causal queries, then a bidirectional block.

    >>> attention_mask(past=10, n_causal=1, n_block=16, dtype=torch.float32, device="cpu").shape
    torch.Size([1, 1, 17, 27])

0 where a query may look, the dtype's minimum where not: a boolean 4D mask would be silently ignored
by eager attention (STACK.md).
"""
from __future__ import annotations

import torch


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
