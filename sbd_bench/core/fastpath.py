"""The fast decode path: a preallocated KV cache reused across prompts, and on CUDA the model's forward
compiled with ``torch.compile`` and replayed as one CUDA graph per query shape (B, Q) the core uses
(1 for NTP, k and n + k for blocks).

    >>> decoder = Decoder(lm, block_size=16, fast=True)     # FastPath.for_model(lm) behind the scenes
    >>> FastPath.for_model(lm).status, FastPath.for_model(lm).warmup_s

What a decode forward costs on a GPU at batch 1 is reading the weights once; what this file removes is
everything else. CUDA graphs remove Python's kernel launches; ``torch.compile`` fuses the small kernels
between the matrix products (norms, rotary embeddings, activations, the mask); the attention reads each
key/value head once (GQA queries packed per head, not keys copied per query head, as transformers'
sdpa does under a mask); the mask is built inside the graph from the cache's device position and a
(Q,) pattern, never as a host-built tensor as wide as the cache; logits are computed only for the
positions the core reads (``logits_to_keep``).

Compile cost is bounded: one compiled function per model serves every query length (the query axis is
compiled as a dynamic size), so a run compiles once per batch-size class and capacity; it is reused
across prompts and solver configurations, and the time spent compiling and capturing is ``warmup_s``
(recorded in ``summary.json``). ``compile=False`` (``--no-compile``) keeps graphs only; a compile or
capture that fails falls back to graphs only, then to eager; ``status`` says which way ran. Prefill is
always eager (its length varies). On CPU the forward runs eagerly (or compiled, if asked) on the same
static cache. Results never depend on which way ran.
"""
from __future__ import annotations

import inspect
import time
import weakref
from contextlib import contextmanager

import torch

from .cache import StaticKVCache
from .masks import Pattern, static_mask

_BY_MODEL: "weakref.WeakKeyDictionary[torch.nn.Module, FastPath]" = weakref.WeakKeyDictionary()
CAPACITY_MIN = 256  # capacities are powers of two from here: nearby prompt lengths share one cache
AS_BEFORE = object()  # FastPath.for_model: keep the model's path as it is
PACKED_ATTENTION = "sbd_packed_sdpa"  # the name under which transformers' AttentionInterface knows ours


class FastPath:
    def __init__(self, lm, compile: bool | None = None):
        from transformers import AttentionInterface

        AttentionInterface.register(PACKED_ATTENTION, packed_sdpa)  # for attention_for_static_cache
        self.lm = lm
        self.static = _plain_static_layers(lm.model.config)
        self.use_graphs = lm.device.type == "cuda" and self.static
        self.compile_asked = self.use_graphs if compile is None else bool(compile)  # None: with the graphs
        self.use_compile = self.static and self.compile_asked
        self._reason = ""  # why the path runs slower than asked, if it does
        self.warmup_s = 0.0  # seconds spent compiling and capturing graphs (and their warm-up forwards)
        self.captures = 0
        self._caches: dict[int, StaticKVCache] = {}  # batch size -> cache
        self._graphs: dict[tuple, _Graph] = {}
        self._constants: dict[tuple, torch.Tensor] = {}  # (Q,) patterns and kept positions, on the device
        self._seen: set[tuple] = set()  # shapes the compiled step has run (without graphs)
        self._compiled = None
        self._pool = None

    @property
    def status(self) -> str:
        """Which way the forwards run, and why not faster."""
        if not self.static:  # sliding-window layers keep a window, not every position: masks differ
            return "reference cache, eager (the model has non-plain attention layers)"
        if self.use_graphs:
            way = "cuda graphs + torch.compile" if self.use_compile else "cuda graphs"
        else:
            way = "static cache, " + ("torch.compile" if self.use_compile else "eager")
        reason = self._reason
        if not reason and self.lm.device.type != "cuda":
            reason = "graphs need CUDA"
        elif not reason and not self.use_compile:
            reason = "torch.compile off"
        return f"{way} ({reason})" if reason else way

    @classmethod
    def for_model(cls, lm, compile=AS_BEFORE) -> "FastPath":
        """One per model, so caches, graphs and compiled code survive from one prompt (one Decoder) and
        one solver configuration to the next. ``compile``: None = on with CUDA graphs, off on CPU; a
        model's path asked for with another setting starts afresh; AS_BEFORE keeps what it has."""
        path = _BY_MODEL.get(lm.model)
        if path is None:
            path = _BY_MODEL[lm.model] = cls(lm, None if compile is AS_BEFORE else compile)
        elif compile is not AS_BEFORE and (path.use_graphs if compile is None else bool(compile)) != path.compile_asked:
            path.__init__(lm, compile)
        return path

    @classmethod
    def release(cls, lm) -> None:
        """Drop ``lm``'s caches and graphs (after an out-of-memory); the next use rebuilds them. The
        compiled code stays: it holds no memory of its own."""
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
            capacity = max(CAPACITY_MIN, 1 << (positions - 1).bit_length())
            self._graphs = {key: g for key, g in self._graphs.items() if key[0] != batch}
            cache = self._caches[batch] = StaticKVCache(self.lm.model.config, capacity, self.lm.device)
        cache.reset()
        return cache

    # ----------------------------------------------------------------------------- the forward
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, pattern: Pattern | None, cache: StaticKVCache,
                keep: int = 0, eager: bool = False) -> torch.Tensor:
        """Float32 logits (B, keep, V) of the last ``keep`` queries (0: all), a fresh tensor. Writes the
        Q queries' keys/values at ``cache.length``; the caller advances the cache. ``eager``: neither
        graphs nor compiled code (prefill, whose length varies; a static cache without the fast path)."""
        batch, q = ids.shape
        cache.check_room(q)
        pattern = pattern or Pattern(q)
        hidden = cache.hidden_columns(pattern.key_pad, batch)  # (B, capacity): one compiled variant for both
        rows = self._constant("kinds", pattern, remember=not eager)
        kept = self._constant("keep", q, keep or q, remember=not eager)
        packed = torch.stack([ids, positions.expand(batch, q), rows.expand(batch, q)])  # (3, B, Q): one input
        if eager:
            return self._call(_step, cache, packed, hidden, kept)
        # batch first in the key: a reallocated cache drops the graphs of its batch size (cache())
        key = (batch, q, pattern.n_causal, kept.shape[0], pattern.key_pad is None, id(cache))
        if self.use_graphs and cache.initialized:  # the first forward allocates the buffers: eager
            graph = self._graphs.get(key) or self._capture(key, cache, packed, hidden, kept)
            if graph is not None:
                return graph.replay(packed)
        if self.use_compile and cache.initialized:
            return self._compiled_call(key, cache, packed, hidden, kept)
        return self._call(_step, cache, packed, hidden, kept)

    def _compiled_call(self, key, cache, packed, hidden, kept) -> torch.Tensor:
        """The compiled step without graphs (CPU): the first call of a shape is counted as warm-up."""
        started, first = time.perf_counter(), key not in self._seen
        try:
            logits = self._call(self._compiled_step(), cache, packed, hidden, kept)
        except Exception as exc:  # noqa: BLE001 - a compile failure: eager from now on, status says why
            cache.sync_position()
            self.use_compile, self._reason = False, f"torch.compile failed: {_one_line(exc)}"
            return self._call(_step, cache, packed, hidden, kept)
        if first:
            self._seen.add(key)
            self.warmup_s += time.perf_counter() - started
        return logits

    def _call(self, step, cache, packed, hidden, kept) -> torch.Tensor:
        if step is not _step:
            _mark_dynamic_axes(packed, kept, hidden, cache)
        with attention_for_static_cache(self.lm.model):
            return step(self.lm.model, cache.hf, packed, hidden, kept, self.lm.dtype, keeps_logits(self.lm.model))

    def _compiled_step(self):
        if self._compiled is None:
            self._compiled = torch.compile(_step, dynamic=None)
        return self._compiled

    def _constant(self, kind: str, *args, remember: bool = True) -> torch.Tensor:
        """Small tensors that never change for a shape, made once on the device (no copy per forward);
        ``remember`` False for shapes seen once (a prefill's length)."""
        key = (kind, *((a.n_causal, a.n_block, a.shadow) if isinstance(a, Pattern) else a for a in args))
        value = self._constants.get(key)
        if value is None:
            if kind == "kinds":  # (Q,) the pattern's shape (Pattern.kinds): 1 causal, 0 block, 2 + i shadow of slot i
                pattern, = args
                value = pattern.kinds(self.lm.device)
            else:  # (keep,) the positions whose logits the core reads: the last ``keep`` of Q
                q, keep = args
                value = torch.arange(q - keep, q, device=self.lm.device)
            if remember:
                self._constants[key] = value
        return value

    def _capture(self, key, cache: StaticKVCache, packed, hidden, kept):
        """A graph for ``key``, compiled first if asked; on failure graphs only, then None (eager)."""
        started = time.perf_counter()
        with torch.cuda.device(self.lm.device):  # streams and captures on the model's GPU, not cuda:0
            while True:
                step = self._compiled_step() if self.use_compile else _step
                try:
                    graph = self._graphs[key] = _Graph(self, step, cache, packed, hidden, kept)
                    break
                except Exception as exc:  # noqa: BLE001 - any failure means: a simpler way from now on
                    recover_from_failed_capture(self.lm.device)
                    cache.sync_position()  # a warm-up cut short may have moved the device position
                    self._graphs.clear()
                    what = _one_line(exc)
                    if self.use_compile:
                        self.use_compile, self._reason = False, f"torch.compile or its capture failed: {what}"
                        continue
                    self.use_graphs, self._reason = False, f"CUDA graph capture failed: {what}"
                    graph = None
                    break
        self.warmup_s += time.perf_counter() - started
        self.captures += graph is not None
        return graph


def _step(model, hf_cache, packed: torch.Tensor, hidden: torch.Tensor | None, kept: torch.Tensor,
          dtype: torch.dtype, keeps_logits: bool) -> torch.Tensor:
    """One forward over a static cache, what is compiled and captured: ``packed`` (3, B, Q) holds the
    ids, the positions and the pattern (``Pattern.kinds``), so that one dynamic size covers them;
    ``kept`` (K,) the query indices whose logits are returned, as float32 (B, K, V)."""
    ids, positions, kinds = packed[0], packed[1], packed[2, 0]
    first = hf_cache.layers[0]
    capacity = first.keys.shape[2] if first.is_initialized else first.max_cache_len
    mask = static_mask(first.cumulative_length, capacity, kinds, hidden, dtype)  # (B, 1, Q, capacity)
    if keeps_logits:
        logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=hf_cache, use_cache=True,
                       logits_to_keep=kept).logits
    else:
        logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=hf_cache,
                       use_cache=True).logits[:, kept]
    return logits.float()


class _Graph:
    """One captured forward for a fixed shape on one cache. The packed inputs are copied into a static
    buffer; the pattern, kept positions and key padding live at fixed addresses already; the write
    position (a tensor inside the cache) advances inside the graph, as in eager mode."""

    def __init__(self, path: FastPath, step, cache: StaticKVCache, packed, hidden, kept):
        self.packed = packed.clone()
        self.kept = kept  # held: the graph reads its address

        def run():
            return path._call(step, cache, self.packed, hidden, kept)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture, as torch.cuda.graphs requires; the
            for _ in range(2):           # first call of a compiled step compiles (or reuses) it here
                run()
                cache.sync_position()  # the warm-up's writes are overwritten by the real replay
        torch.cuda.current_stream().wait_stream(stream)
        if path._pool is None:
            path._pool = torch.cuda.graph_pool_handle()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the memory sampler's thread (harness) may touch the device during a capture
        with torch.cuda.graph(self.graph, pool=path._pool, capture_error_mode="thread_local"):
            self.logits = run()  # recorded, not run: the cache position is unchanged until replay

    def replay(self, packed) -> torch.Tensor:
        self.packed.copy_(packed)
        self.graph.replay()
        return self.logits.clone()  # the next replay overwrites the graph's output


def recover_from_failed_capture(device: torch.device) -> None:
    """Give the device's default CUDA generator back a state that is not stuck in a capture.

    torch 2.11 and 2.12 mark the default generator as capturing in ``capture_begin`` and clear the mark
    only when ``capture_end`` succeeds (per generator, ``CUDAGeneratorState::capturing_``). After a
    capture that failed (an invalidated stream capture), every later CUDA random op of the process, a
    sampling solver's or the user's own, raised "Offset increment outside graph capture encountered
    unexpectedly". A fresh state with the same seed and offset (``clone_state`` starts not capturing)
    takes its place; graphs captured before the failure keep the old state and are dropped by the
    caller. From torch 2.13 the state is kept per capture and this changes nothing."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    try:
        generator.graphsafe_set_state(generator.clone_state())
    except Exception:  # noqa: BLE001 - a torch without graph-safe generator states: nothing to repair with
        pass


@contextmanager
def attention_for_static_cache(model):
    """The static path's attention while inside: for a model configured with sdpa, ``packed_sdpa``
    (the same scaled dot product, GQA queries packed per key/value head, no key copies). Other
    implementations are kept (eager attention takes the additive mask as it is)."""
    config = model.config
    before = config._attn_implementation
    if before != "sdpa":
        yield
        return
    config._attn_implementation = PACKED_ATTENTION  # registered by FastPath.__init__
    try:
        yield
    finally:
        config._attn_implementation = before


def packed_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """sdpa over a static cache with grouped-query attention: query (B, Hq, Q, D) is viewed as
    (B, Hkv, rep * Q, D) so each of the Hkv key/value heads (B, Hkv, C, D) is read once, where
    transformers' sdpa copies them rep times (``repeat_kv``) whenever a mask is given. The additive
    mask (B, 1, Q, C) is shared by all heads; row r * Q + q of a packed head is query q of head r."""
    batch, heads, q, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    rep = heads // kv_heads
    if rep > 1:  # sizes spelt out: a -1 beside the compiled, unknown Q would need a guard on Q
        query = query.reshape(batch, kv_heads, rep * q, dim)
        attention_mask = attention_mask.expand(batch, rep, q, columns).reshape(batch, 1, rep * q, columns)
    torch._check(q > 0)  # compiled with an unknown Q, sdpa's shape checks would otherwise stop the graph
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, q, dim).transpose(1, 2).contiguous(), None  # (B, Q, Hq, D)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _mark_dynamic_axes(packed: torch.Tensor, kept: torch.Tensor, hidden: torch.Tensor, cache) -> None:
    """Compile the sizes that vary within a run as symbols, so that it compiles about a minute (8B model)
    once per batch-size class (1, or more) instead of once per shape. The query axis (and the kept
    positions) as sizes unknown at compile time: one compiled function serves Q = 1 (NTP) and every
    block shape, where an ordinary dynamic size is specialised at 1. The capacity (a prompt longer than
    any before reallocates the cache) and a batch size above 1 as dynamic sizes."""
    try:
        from torch._dynamo.decorators import mark_unbacked
    except ImportError:  # an older torch: a dynamic size (recompiles once for Q = 1)
        from torch._dynamo import mark_dynamic as mark_unbacked
    from torch._dynamo import maybe_mark_dynamic

    mark_unbacked(packed, 2)
    mark_unbacked(kept, 0)
    buffers = [hidden] + [t for layer in cache.hf.layers for t in (layer.keys, layer.values)]
    for tensor in buffers:  # hidden (B, C); keys, values (B, H, C, D)
        maybe_mark_dynamic(tensor, 1 if tensor is hidden else 2)
    if packed.shape[1] > 1:
        maybe_mark_dynamic(packed, 1)
        for tensor in buffers:
            maybe_mark_dynamic(tensor, 0)


_KEEPS_LOGITS: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def keeps_logits(model) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (transformers' causal LMs mostly do)."""
    known = _KEEPS_LOGITS.get(model)
    if known is None:
        known = _KEEPS_LOGITS[model] = "logits_to_keep" in inspect.signature(model.forward).parameters
    return known


def _plain_static_layers(config) -> bool:
    """True when transformers' StaticCache gives this model plain full-attention layers, each
    returning every cached position (what ``static_mask`` assumes)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    try:
        layers = StaticCache(config=config, max_cache_len=1).layers
    except Exception:  # noqa: BLE001 - a config StaticCache cannot describe: use the reference cache
        return False
    return all(type(layer) is StaticLayer for layer in layers)
