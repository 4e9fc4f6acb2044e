"""The KV cache of committed tokens: an explicit length, ``advance`` after a forward, ``rollback``
to drop a block's keys/values, ``keep`` to drop different columns per row (batched verified decoding),
and ``reset``.

Only causally computed keys/values are ever kept, so the cache is bit-for-bit what an NTP model holds.
Two versions with the same methods:

  KVCache        the reference: transformers' ``DynamicCache``, grows by concatenation.
  StaticKVCache  preallocated (B, H_kv, capacity, D) per layer (transformers' ``StaticCache``): each
                 forward writes its Q new keys/values at the position ``length``, rollback only moves
                 the position back. Tensor addresses never change, so CUDA graphs can replay over it
                 (core/fastpath.py, which also builds its masks: core/masks.py ``static_mask``).

    >>> cache = StaticKVCache(model.config, capacity=512)
    >>> cache.length, cache.position        # the host's count; the device's, which the model advances

Both are passed to the model as ``cache=cache.hf``; the decoding core calls ``advance(q)`` after each
forward of q queries (the static cache's length lives on the host, so reading it never waits for the
device).
"""
from __future__ import annotations

import torch


class CacheFullError(RuntimeError):
    """A forward would write past a preallocated cache's capacity."""


def _dynamic_cache(config):
    """A ``DynamicCache`` that a forward may also read without writing (``KVCache.read_only``)."""
    global _ReadableCache, _DynamicLayer
    if _ReadableCache is None:  # transformers is imported here, with the first cache (it loads slowly)
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        class _ReadableCache(DynamicCache):
            read_only = False  # this forward's queries attend to the cache and their own keys/values, keeping none

            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                if not self.read_only:
                    return super().update(key_states, value_states, layer_idx, *args, **kwargs)
                layer = self.layers[layer_idx]  # what DynamicLayer.update returns, without storing it
                return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)

        _DynamicLayer = DynamicLayer
    return _ReadableCache(config=config)


_ReadableCache = _DynamicLayer = None


class KVCache:
    def __init__(self, config):
        self.config = config
        self.hf = _dynamic_cache(config)  # per layer: keys/values (B, H_kv, T, D)
        self.length = 0  # positions held, counted on the host as in StaticKVCache (cheaper than asking hf)
        self._plain = False  # every layer a DynamicLayer holding keys: read_only can be honoured

    def read_only(self) -> bool:
        """Let the next forward attend to the cache without writing to it, when it keeps none of its keys and
        values (a block forward carrying nothing: SBD.md §3): the ``rollback`` after it then only counts, and the
        forward's queries see exactly what they would have seen had they been written and cropped. False (and
        nothing changed) where a layer could not (an empty cache, a sliding-window layer): the forward writes."""
        if not self._plain:
            layers = self.hf.layers
            self._plain = len(layers) > 0 and all(type(x) is _DynamicLayer and x.is_initialized for x in layers)
        self.hf.read_only = self._plain
        return self._plain

    def advance(self, q: int) -> None:
        """A forward wrote ``q`` positions (the DynamicCache has grown by itself)."""
        self.length += q

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` positions (a block's mask-dependent keys/values)."""
        if n > 0:
            if self.hf.read_only:  # a read-only forward wrote nothing
                self.hf.read_only = False
            else:
                for layer in self.hf.layers:  # DynamicCache.crop's per-layer slice, without its calls and checks
                    if type(layer) is _DynamicLayer and layer.is_initialized:
                        layer.keys, layer.values = layer.keys[..., :-n, :], layer.values[..., :-n, :]
                    else:  # another kind of layer (a sliding window's) crops its own way
                        layer.crop(-n)
            self.length -= n

    def reset(self) -> None:
        self.hf, self.length, self._plain = _dynamic_cache(self.config), 0, False

    def keep(self, columns: torch.Tensor) -> None:
        """Keep, for each row b, the cached columns ``columns[b]`` (B, L) in that order: the length becomes
        L. Batched verified decoding drops each row's rejected keys/values with it (core/verify.py)."""
        for layer in self.hf.layers:
            if layer.is_initialized and layer.keys.numel():
                layer.keys, layer.values = _gather_columns(layer.keys, columns), _gather_columns(layer.values, columns)
        self.length = columns.shape[1]


class StaticKVCache:
    """Preallocated cache of ``capacity`` positions; see the module docstring.

    The batch size, dtype and device are fixed by the first forward (transformers allocates the
    buffers lazily, at their exact dtype and device). Columns at and past ``length`` hold stale or
    zero values: the masks block them, so they never contribute to attention.
    """

    def __init__(self, config, capacity: int, device="cpu"):
        from transformers import StaticCache

        if capacity < 1:
            raise ValueError(f"StaticKVCache capacity must be >= 1 (got {capacity})")
        self.config, self.capacity = config, capacity
        self.device = torch.device(device)
        self.hf = StaticCache(config=config, max_cache_len=capacity)
        self.length = 0  # host copy of every layer's write position (``position`` on the device)
        self._hidden: dict[bool, torch.Tensor] = {}  # (B, capacity) key padding, see ``hidden_columns``

    @property
    def initialized(self) -> bool:
        """Whether the first forward has allocated the buffers (and moved the positions to the device)."""
        return all(layer.is_initialized for layer in self.hf.layers)

    @property
    def position(self) -> torch.Tensor:
        """The write position as the model sees it: a 0-d tensor on the device, advanced inside each
        forward; what masks built inside a CUDA graph read."""
        return self.hf.layers[0].cumulative_length

    def check_room(self, q: int) -> None:
        if self.length + q > self.capacity:
            raise CacheFullError(f"static KV cache full: {self.length} + {q} positions > capacity {self.capacity}")

    def advance(self, q: int) -> None:
        """A forward wrote ``q`` positions (the model moved the device positions itself)."""
        self.length += q

    # inference_mode: the position tensors may have been made inside it (Decoder.forward is), and
    def read_only(self) -> bool:
        """A static cache's forwards always write (in place, where a rollback only moves the position back)."""
        return False

    # only there may they be changed in place
    @torch.inference_mode()
    def rollback(self, n: int) -> None:
        """Move every layer's write position back by ``n``; the buffers stay (one kernel for all layers)."""
        if n > 0:
            if n > self.length:
                raise ValueError(f"cannot roll back {n} positions of a cache holding {self.length}")
            self.length -= n
            torch._foreach_sub_(self._positions(), n)

    @torch.inference_mode()
    def reset(self) -> None:
        """Back to empty: only the positions move, the stale values are masked anyway."""
        self.length = 0
        torch._foreach_zero_(self._positions())

    @torch.inference_mode()
    def keep(self, columns: torch.Tensor) -> None:
        """As ``KVCache.keep``, in place: the buffers stay where they are (CUDA graphs read them)."""
        width = columns.shape[1]
        for layer in self.hf.layers:
            if layer.is_initialized:
                layer.keys[:, :, :width] = _gather_columns(layer.keys, columns)
                layer.values[:, :, :width] = _gather_columns(layer.values, columns)
        self.length = width
        self.sync_position()

    @torch.inference_mode()
    def sync_position(self) -> None:
        """Set the device positions to the host's count (after forwards that were not kept: the fast
        path's warm-ups, or a forward cut short)."""
        positions = self._positions()
        torch._foreach_zero_(positions)
        if self.length:
            torch._foreach_add_(positions, self.length)

    def _positions(self) -> list[torch.Tensor]:
        return [layer.cumulative_length for layer in self.hf.layers]

    @torch.inference_mode()
    def hidden_columns(self, key_pad: torch.Tensor | None, batch: int) -> torch.Tensor:
        """(B, capacity) bool, True on the columns no query of the row may see: ``key_pad`` (B, W)
        copied into the first W columns of a buffer whose address never changes (a CUDA graph reads
        it); for ``None``, another buffer that stays all False. Columns past W are never looked at
        (``static_mask``)."""
        buffer = self._hidden.get(key_pad is None)
        if buffer is None or buffer.shape[0] != batch:
            buffer = self._hidden[key_pad is None] = torch.zeros(batch, self.capacity, dtype=torch.bool,
                                                                 device=self.device)
        if key_pad is not None:
            buffer[:, : key_pad.shape[1]].copy_(key_pad)
        return buffer


def _gather_columns(states: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """states (B, H, T, D), columns (B, L) -> (B, H, L, D): row b's columns ``columns[b]``."""
    index = columns.to(states.device)[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
    return states.gather(2, index)
