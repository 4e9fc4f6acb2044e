"""Exact mode (``--exact``): every query row of every forward is computed by kernel calls that see that
row alone, so its result does not depend on how many rows, or which batch rows, share the forward.
Then verified decoding gives NTP's output and batch N gives batch 1's, bit for bit, in any dtype.

    >>> lm = load_model("sbd-tiny", dtype="bfloat16", exact=True)    # wrap_rows + EXACT_ATTENTION

Why it is needed: a matrix product over M rows does not round each row as a product over one row does
(CPU BLAS picks its kernel and its split of the reduction by M), and the attention of a query is a sum
over every column of the cache, masked ones included, in an order set by the cache's width. So a key
written by a 25-token forward differs from the one written token by token (2e-6 in fp32, 0.06 in bf16),
and where NTP's top two logits are one bf16 step apart, verified decoding departed from NTP's output.

How: the loaded model's modules are wrapped in ours, as peft does (no library code is changed, the
folder stays a plain Hugging Face model): linear layers in ``LinearRowByRow``, norms and activations in
``RowByRow``, the rotary embedding in ``PositionByPosition``, and the attention is ``exact_attention``
(registered with transformers' AttentionInterface); each says how. What stays outside is elementwise
and correctly rounded (residual additions, the MLP's gate product, the rotary products, casts, the
embedding lookup), which no neighbour can change.

Conditions: the same machine and thread count (kernels are deterministic for a given shape there, not
across CPUs); the CPU (on CUDA the same calls are not known to be deterministic and would be far too
slow: batch-invariant GPU kernels are needed, see the docs); model families whose modeling code was
read for operations that mix rows (``SUPPORTED``). The cost: one kernel call per row instead of one
per forward (measured in the docs).
"""
from __future__ import annotations

import torch
from torch import nn

from ..types import UsageError

EXACT_ATTENTION = "sbd_exact"  # the name under which transformers' AttentionInterface knows ours
SUPPORTED = ("llama", "qwen3", "qwen2", "mistral")  # modeling code read: every row-mixing operation is covered
FIXED_ROPE = ("default", "linear", "llama3", "yarn")  # frequencies that do not depend on the sequence length


class ExactModeError(UsageError):
    """The model or device cannot run in exact mode; the message says why and what to do."""


class LinearRowByRow(nn.Module):
    """An ``nn.Linear`` computed one row (token) at a time: (..., in) -> (..., out), each row a fresh
    (1, in) copy in the compute dtype (a one-row kernel: the same shape, values and alignment whatever
    else is in the forward). bf16/fp16 rows and weights are widened to float32 (the weight once per
    call) and the result rounded once, as a bf16 GEMM does; a one-row bf16 product is ~50x slower here."""

    def __init__(self, inner: nn.Linear):
        super().__init__()
        self.inner = inner

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight, bias = self.inner.weight, self.inner.bias
        compute = torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else weight.dtype
        weight = weight.to(compute)  # the same tensor when already in the compute dtype
        bias = None if bias is None else bias.to(compute)
        rows = hidden.reshape(-1, hidden.shape[-1])  # (N, in)
        out = torch.empty(rows.shape[0], weight.shape[0], dtype=hidden.dtype, device=hidden.device)  # (N, out)
        for i in range(rows.shape[0]):
            out[i] = torch.nn.functional.linear(rows[i : i + 1].to(compute, copy=True), weight, bias)[0]
        return out.reshape(*hidden.shape[:-1], weight.shape[0])


class RowByRow(nn.Module):
    """Runs ``inner`` once per token: input (B, Q, ...) -> B * Q calls on (1, ...) rows, each a fresh
    contiguous copy (its own allocation, so alignment is the allocator's, never the row's offset)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        lead = hidden.shape[:2] if hidden.dim() >= 3 else hidden.shape[:1]
        rows = hidden.reshape(-1, *hidden.shape[len(lead):])  # (N, ...): one token per row
        if rows.shape[0] == 0:
            return self.inner(hidden)
        out = torch.cat([self.inner(rows[i : i + 1].clone()) for i in range(rows.shape[0])])
        return out.reshape(*lead, *out.shape[1:])


class PositionByPosition(nn.Module):
    """A rotary embedding whose cos/sin for position p are computed once, by a call on p alone, and
    looked up afterwards: the same bits wherever p appears (cos and sin of a long vector may take
    vectorised or scalar code paths depending on an element's place in it)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self._table: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor):
        positions = position_ids.reshape(-1).tolist()
        key = (hidden.dtype, hidden.device)
        for p in dict.fromkeys(positions):
            if (p, *key) not in self._table:
                cos, sin = self.inner(hidden[:1, :1], torch.tensor([[p]], device=hidden.device))
                self._table[(p, *key)] = cos[0, 0], sin[0, 0]
        cos = torch.stack([self._table[(p, *key)][0] for p in positions])
        sin = torch.stack([self._table[(p, *key)][1] for p in positions])
        return cos.reshape(*position_ids.shape, -1), sin.reshape(*position_ids.shape, -1)


def exact_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Attention one query at a time over exactly the keys it may see. query (B, Hq, Q, D), key and
    value (B, Hkv, C, D), attention_mask additive (B or 1, 1, Q, C) with 0 where a query may look, or
    None: causal over the C columns (query i sees the first C - Q + i + 1). Computed in float32 from
    fresh copies; returns (B, Q, Hq, D) in the query's dtype, as transformers' attention functions do."""
    batch, heads, q_len, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    rep = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    if attention_mask is None:
        visible = torch.ones(q_len, columns, dtype=torch.bool, device=query.device).tril(columns - q_len)[None]
    else:
        visible = attention_mask[:, 0] if attention_mask.dtype == torch.bool else attention_mask[:, 0] == 0
    out = torch.empty(batch, q_len, heads, dim, dtype=query.dtype, device=query.device)
    for b in range(batch):
        for i in range(q_len):
            seen = visible[b if visible.shape[0] > 1 else 0, i].nonzero()[:, 0]  # (L,) in cache order
            keys = key[b].index_select(1, seen).float()  # (Hkv, L, D), a fresh tensor
            values = value[b].index_select(1, seen).float()
            q = query[b, :, i].to(torch.float32, copy=True).reshape(kv_heads, rep, dim)  # (Hkv, rep, D)
            probs = (torch.matmul(q, keys.transpose(1, 2)) * scale).softmax(-1)  # (Hkv, rep, L)
            out[b, i] = torch.matmul(probs, values).reshape(heads, dim).to(query.dtype)
    return out, None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(EXACT_ATTENTION, exact_attention)  # one dict entry: again changes nothing


def check_exact(config, device: torch.device) -> None:
    """Refuse what exact mode cannot promise, with the reason and the fix."""
    if device.type != "cpu":
        raise ExactModeError(f"--exact runs on the CPU only (the model is on {device.type}): on a GPU it needs "
                             f"batch-invariant kernels this project does not have yet; use --device cpu, or drop "
                             f"--exact")
    if config.model_type not in SUPPORTED:
        raise ExactModeError(f"--exact supports the model families {', '.join(SUPPORTED)} (their modeling code is "
                             f"known to mix rows only where it is wrapped), not {config.model_type!r}; drop --exact")
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in FIXED_ROPE:
        raise ExactModeError(f"--exact needs rotary frequencies that do not depend on the sequence length "
                             f"({', '.join(FIXED_ROPE)}); this model's rope_type is {rope!r}; drop --exact")


ACTIVATION_MODULES = ("transformers.activations", "torch.nn.modules.activation")


def wrap_rows(module: nn.Module) -> None:
    """Wrap, in place, a loaded model's row-local modules: the rotary embedding position by position;
    linear layers, norms and activations token by token. Idempotent. The model must also use
    ``EXACT_ATTENTION`` (``load_model(..., exact=True)`` does both)."""
    for name, child in module.named_children():
        kind = type(child).__name__
        if isinstance(child, (LinearRowByRow, RowByRow, PositionByPosition)):
            continue
        if kind.endswith("RotaryEmbedding"):
            setattr(module, name, PositionByPosition(child))
        elif isinstance(child, nn.Linear):
            setattr(module, name, LinearRowByRow(child))
        elif isinstance(child, nn.LayerNorm) or kind.endswith("RMSNorm") or type(child).__module__ in ACTIVATION_MODULES:
            setattr(module, name, RowByRow(child))
        else:
            wrap_rows(child)
