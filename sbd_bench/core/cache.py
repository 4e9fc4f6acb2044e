"""The KV cache of committed tokens: an explicit length, ``rollback`` to drop a block's
keys/values after a forward, ``keep`` to drop different columns per row (batched verified decoding),
``reset``, and the bytes per token for reports.

Only causally computed keys/values are ever kept, so the cache is bit-for-bit what an NTP model holds.
Two versions with the same methods:

  KVCache        the reference: transformers' ``DynamicCache``, grows by concatenation.
  StaticKVCache  preallocated (B, H_kv, capacity, D) per layer (transformers' ``StaticCache``): each
                 forward writes its Q new keys/values at the explicit position ``length``, rollback
                 only moves the position back. Tensor addresses never change, so CUDA graphs can
                 replay over it (sbd_bench/fastpath.py).

    >>> cache = StaticKVCache(model.config, capacity=512)
    >>> mask = cache.fit_mask(mask, q)      # (B, 1, Q, capacity): the model sees every column

Both are passed to the model as ``cache=cache.hf``; the decoding core calls ``fit_mask`` before each
forward, which is the identity for the reference cache.
"""
from __future__ import annotations

import torch

from .masks import attention_mask


class CacheFullError(RuntimeError):
    """A forward would write past a preallocated cache's capacity."""


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8


class KVCache:
    def __init__(self, config):
        from transformers import DynamicCache

        self.config = config
        self.hf = DynamicCache(config=config)  # per layer: keys/values (B, H_kv, T, D)

    @property
    def length(self) -> int:
        return self.hf.get_seq_length()

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` positions (a block's mask-dependent keys/values)."""
        if n > 0:
            self.hf.crop(-n)

    def reset(self) -> None:
        from transformers import DynamicCache

        self.hf = DynamicCache(config=self.config)

    def keep(self, columns: torch.Tensor) -> None:
        """Keep, for each row b, the cached columns ``columns[b]`` (B, L) in that order: the length becomes
        L. Batched verified decoding drops each row's rejected keys/values with it (core/batching.py)."""
        for layer in self.hf.layers:
            if layer.is_initialized and layer.keys.numel():
                layer.keys, layer.values = _gather_columns(layer.keys, columns), _gather_columns(layer.values, columns)

    def fit_mask(self, mask: torch.Tensor | None, q: int) -> torch.Tensor | None:
        """The mask the model needs for ``q`` new queries: unchanged, the cache grows to length + q."""
        return mask

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return kv_bytes_per_token(self.config, dtype)


class StaticKVCache:
    """Preallocated cache of ``capacity`` positions; see the module docstring.

    The batch size, dtype and device are fixed by the first forward (transformers allocates the
    buffers lazily, at their exact dtype and device). Columns at and past ``length`` hold stale or
    zero values: ``fit_mask`` blocks them, so they never contribute to attention.
    """

    def __init__(self, config, capacity: int, dtype: torch.dtype = torch.float32, device="cpu"):
        from transformers import StaticCache

        if capacity < 1:
            raise ValueError(f"StaticKVCache capacity must be >= 1 (got {capacity})")
        self.config, self.capacity = config, capacity
        self.dtype, self.device = dtype, torch.device(device)  # the model's: for masks built here
        self.hf = StaticCache(config=config, max_cache_len=capacity)

    @property
    def length(self) -> int:
        layer = self.hf.layers[0]
        return int(layer.cumulative_length) if layer.is_initialized else 0

    # inference_mode: the position tensors may have been made inside it (Decoder.forward is), and
    # only there may they be changed in place
    @torch.inference_mode()
    def rollback(self, n: int) -> None:
        if n > 0:
            self.hf.crop(-n)  # moves every layer's write position back; the buffers stay

    @torch.inference_mode()
    def reset(self) -> None:
        for layer in self.hf.layers:  # only the position: the stale values are masked anyway
            layer.cumulative_length.zero_()

    @torch.inference_mode()
    def keep(self, columns: torch.Tensor) -> None:
        """As ``KVCache.keep``, in place: the buffers stay where they are (CUDA graphs read them)."""
        width = columns.shape[1]
        for layer in self.hf.layers:
            if layer.is_initialized:
                layer.keys[:, :, :width] = _gather_columns(layer.keys, columns)
                layer.values[:, :, :width] = _gather_columns(layer.values, columns)
                layer.cumulative_length.fill_(width)

    def fit_mask(self, mask: torch.Tensor | None, q: int) -> torch.Tensor:
        """Widen an additive mask (B, 1, Q, length + q) to (B, 1, Q, capacity), blocking the unused
        columns; ``None`` (plain causal prefill) becomes the explicit causal mask."""
        past = self.length
        if past + q > self.capacity:
            raise CacheFullError(f"static KV cache full: {past} + {q} positions > capacity {self.capacity}")
        if mask is None:
            mask = attention_mask(past, q, 0, self.dtype, self.device)
        width = mask.shape[-1]
        if width > self.capacity:
            raise CacheFullError(f"attention mask of width {width} > static cache capacity {self.capacity}")
        if width == self.capacity:
            return mask
        pad = mask.new_full((*mask.shape[:-1], self.capacity - width), torch.finfo(mask.dtype).min)
        return torch.cat([mask, pad], dim=-1)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return kv_bytes_per_token(self.config, dtype)


def _gather_columns(states: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """states (B, H, T, D), columns (B, L) -> (B, H, L, D): row b's columns ``columns[b]``."""
    index = columns.to(states.device)[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
    return states.gather(2, index)
