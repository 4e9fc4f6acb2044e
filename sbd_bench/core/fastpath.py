"""The fast decode path: a preallocated KV cache reused across prompts, and on CUDA one CUDA graph
per query shape (B, Q) that the core uses (1 for NTP, k and n + k for blocks), replayed instead of
launching the model's kernels one by one from Python.

    >>> decoder = Decoder(lm, block_size=16, fast=True)   # FastPath.for_model(lm) behind the scenes

Why graphs and not torch.compile: at batch 1 an 8B forward is a few milliseconds of bandwidth-bound
kernels and Python launch overhead is the cost to remove; a graph capture costs one forward, where
compiling each (B, Q) shape costs minutes. Graphs need fixed tensor addresses, hence the static
cache, whose buffers never move (rollback only moves its position), and a mask as wide as the cache.

Prefill is always eager (its length varies). On CPU, or if a capture fails, the forward runs eagerly
on the same static cache, and ``status`` says why; results never depend on which way ran.
"""
from __future__ import annotations

import weakref

import torch

from .cache import StaticKVCache

_BY_MODEL: "weakref.WeakKeyDictionary[torch.nn.Module, FastPath]" = weakref.WeakKeyDictionary()
CAPACITY_STEP = 256  # capacities are rounded up so that nearby prompt lengths share one cache


class FastPath:
    def __init__(self, lm):
        self.lm = lm
        self.static = _plain_static_layers(lm.model.config)
        self.use_graphs = lm.device.type == "cuda" and self.static
        if not self.static:  # sliding-window layers keep a window, not every position: masks differ
            self.status = "reference cache, eager (the model has non-plain attention layers)"
        else:
            self.status = "cuda graphs" if self.use_graphs else "static cache, eager (graphs need CUDA)"
        self._caches: dict[int, StaticKVCache] = {}  # batch size -> cache
        self._graphs: dict[tuple, _Graph] = {}
        self._pool = None

    @classmethod
    def for_model(cls, lm) -> "FastPath":
        """One per model, so caches and graphs survive from one prompt (one Decoder) to the next."""
        path = _BY_MODEL.get(lm.model)
        if path is None:
            path = _BY_MODEL[lm.model] = cls(lm)
        return path

    @classmethod
    def release(cls, lm) -> None:
        """Drop ``lm``'s caches and graphs (after an out-of-memory); the next use rebuilds them."""
        path = _BY_MODEL.get(lm.model)
        if path is not None:
            path._caches.clear()
            path._graphs.clear()
            path._pool = None

    def cache(self, batch: int, positions: int) -> StaticKVCache:
        """The reset cache for ``batch`` rows, reallocated (and its graphs dropped) only when too small."""
        if not self.static:
            from .cache import KVCache

            return KVCache(self.lm.model.config)
        cache = self._caches.get(batch)
        if cache is None or cache.capacity < positions:
            capacity = -(-positions // CAPACITY_STEP) * CAPACITY_STEP
            self._graphs = {key: g for key, g in self._graphs.items() if key[0] != batch}
            cache = self._caches[batch] = StaticKVCache(self.lm.model.config, capacity, self.lm.dtype, self.lm.device)
        cache.reset()
        return cache

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """Logits (B, Q, V), a fresh tensor. ``mask`` is already as wide as the cache."""
        if not self.use_graphs or not isinstance(cache, StaticKVCache) or not _initialized(cache):
            return self._eager(ids, positions, mask, cache)
        # batch first in the key: a reallocated cache drops the graphs of its batch size
        key = (ids.shape[0], tuple(ids.shape), tuple(positions.shape), tuple(mask.shape), mask.dtype, id(cache.hf))
        graph = self._graphs.get(key)
        with torch.cuda.device(ids.device):  # streams and captures on the model's GPU, not cuda:0
            if graph is None:
                before = cache.length
                try:
                    graph = self._graphs[key] = _Graph(self, ids, positions, mask, cache)
                except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly from now on
                    self.use_graphs = False
                    self.status = f"static cache, eager (CUDA graph capture failed: {type(exc).__name__}: {exc})"
                    self._graphs.clear()
                    torch.cuda.synchronize()
                    cache.rollback(cache.length - before)  # a warm-up cut short may have written
                    return self._eager(ids, positions, mask, cache)
            return graph.replay(ids, positions, mask)

    def _eager(self, ids, positions, mask, cache) -> torch.Tensor:
        return self.lm.model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache.hf,
                             use_cache=True).logits


def _plain_static_layers(config) -> bool:
    """True when transformers' StaticCache gives this model plain full-attention layers, each
    returning every cached position (what ``StaticKVCache.fit_mask`` assumes)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    try:
        layers = StaticCache(config=config, max_cache_len=1).layers
    except Exception:  # noqa: BLE001 - a config StaticCache cannot describe: use the reference cache
        return False
    return all(type(layer) is StaticLayer for layer in layers)


def _initialized(cache: StaticKVCache) -> bool:
    return all(layer.is_initialized for layer in cache.hf.layers)


class _Graph:
    """One captured forward for a fixed (B, Q) on one cache. Inputs are copied into static buffers;
    the write position (a tensor inside the cache) advances inside the graph, as in eager mode."""

    def __init__(self, path: FastPath, ids, positions, mask, cache: StaticKVCache):
        model = path.lm.model
        self.ids, self.positions, self.mask = ids.clone(), positions.clone(), mask.clone()

        def run():
            return model(input_ids=self.ids, position_ids=self.positions, attention_mask=self.mask,
                         cache=cache.hf, use_cache=True).logits

        q = ids.shape[1]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture, as torch.cuda.graphs requires
            for _ in range(2):
                run()
                cache.rollback(q)  # the warm-up's writes are overwritten by the real replay
        torch.cuda.current_stream().wait_stream(stream)
        if path._pool is None:
            path._pool = torch.cuda.graph_pool_handle()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the memory sampler's thread (harness) may touch the device during a capture
        with torch.cuda.graph(self.graph, pool=path._pool, capture_error_mode="thread_local"):
            self.logits = run()  # recorded, not run: the cache position is unchanged until replay

    def replay(self, ids, positions, mask) -> torch.Tensor:
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.mask.copy_(mask)
        self.graph.replay()
        return self.logits.clone()  # the next replay overwrites the graph's output
