"""The KV cache of committed tokens: an explicit length, ``rollback`` to drop a block's
keys/values after a forward, and the bytes per token for reports.

Only causally computed keys/values are ever kept, so the cache is bit-for-bit what an NTP model holds.
This reference version wraps transformers' ``DynamicCache`` (it grows by concatenation); a
preallocated cache with the same four methods can replace it on GPU.
"""
from __future__ import annotations

import torch


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

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        cfg = self.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return 2 * cfg.num_hidden_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
