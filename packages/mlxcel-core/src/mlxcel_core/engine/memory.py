"""Memory admission: how many KV blocks fit beside the weights and a step's activations.

The budget follows vLLM's profile run (measure what the weights hold, then a step's
transient peak, and give the KV cache what is left of the usable device memory) without
its full-size pass: a forward pass of a whole prefill chunk costs milliseconds on a GPU
but up to a minute on a CPU, before the first token. Instead two passes of a few tokens
record what each layer caches and measure how the transient peak grows per token,
and the largest step is scaled from them, with the attention scores over a full context
(which a few tokens cannot show) counted from the recorded head counts (docs/memory.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.cache import AttentionMask, make_causal_mask
from mlxcel_core.cache.layout import CacheLayout, LayerCacheKind, model_cache_layout
from mlxcel_core.cache.paged import LayerGeometry
from mlxcel_core.cache.state import (
    CompositeCache,
    StateArrayGeometry,
    StateCache,
    StateLayerGeometry,
)
from mlxcel_core.language_model import LanguageModel


def device_memory_bytes() -> int:
    """The default device's memory: MLX's figure for a GPU, physical RAM for the CPU."""
    size = mx.device_info().get("memory_size")
    if isinstance(size, int) and size > 0:
        return size
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# Tokens of the two measuring passes: few enough to cost milliseconds, enough rows for the
# prefill products a longer chunk runs (quantized layers switch tactic from a few rows).
RECORDING_TOKENS = (8, 32)
# Attention over a chunk materializes float32 scores, masked scores and probabilities; MLX
# does not always keep all three alive, so this is an upper count (docs/memory.md).
_SCORE_ARRAYS = 3
_SCORE_DTYPE = mx.float32
# Headroom on what the passes measured: the order MLX evaluates a pass in, and so its peak,
# varies by a few percent between runs, and by tens of kilobytes for small arrays.
_MEASUREMENT_HEADROOM = 1.1
MEASUREMENT_SLACK_BYTES = 2**20


class _RecordingCache:
    """A one-pass `KVCache` and `AttentionCache` that notes each layer's key/value
    geometry and its number of query heads."""

    def __init__(self) -> None:
        self.geometry: LayerGeometry | None = None
        self.num_query_heads = 0
        self._stored: tuple[mx.array, mx.array] | None = None

    @property
    def offset(self) -> int:
        return 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        _, heads, _, key_dim = keys.shape
        self.geometry = LayerGeometry(heads, key_dim, values.shape[3], keys.dtype)
        self._stored = (keys, values)
        return keys, values

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """What `update_and_fetch` stored, for layers that share another layer's KV.

        Raises:
            ValueError: nothing was stored yet.
        """
        if self._stored is None:
            raise ValueError("no keys and values were stored in this layer")
        return self._stored

    def make_mask(
        self, num_queries: int, *, return_array: bool = False, window_size: int | None = None
    ) -> AttentionMask:
        if window_size is not None or return_array:
            return make_causal_mask(num_queries, 0, window_size=window_size)
        return "causal" if num_queries > 1 else None

    def trim(self, num_tokens: int) -> int:
        return 0

    def attention(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float,
        mask: AttentionMask,
    ) -> mx.array:
        self.num_query_heads = queries.shape[1]
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)


class _RecordingStateCache(StateCache):
    """A one-pass state cache that notes the shape and dtype of each array written."""

    def __init__(self, num_arrays: int) -> None:
        self._values: list[mx.array | None] = [None] * num_arrays

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index: int) -> mx.array | None:
        return self._values[index]

    def __setitem__(self, index: int, value: mx.array) -> None:
        self._values[index] = value

    @property
    def geometry(self) -> StateLayerGeometry:
        return tuple(
            None if value is None else StateArrayGeometry(tuple(value.shape[1:]), value.dtype)
            for value in self._values
        )


def _recording_cache(part: LayerCacheKind) -> _RecordingCache | _RecordingStateCache:
    return _RecordingCache() if part.stores_kv else _RecordingStateCache(part.num_arrays)


@dataclass(frozen=True)
class ModelProfile:
    """What the measuring passes found, and the largest step's memory scaled from them.

    Attributes:
        layers: each attention layer's key/value geometry (the layout's attention parts).
        resident_bytes: memory MLX held before the passes (the weights, mostly).
        transient_bytes: the largest step's peak above that (activations of one prefill
            chunk at the end of a full context), as `profile_model` scales it.
        vocab_size: the width of the model's logits.
        state_layers: each state layer's array geometry (the layout's state parts).
        prefill_seconds: the wall time of a prefill pass as (seconds whatever its length,
            seconds per token), fitted to the two passes; None when not measured.
    """

    layers: tuple[LayerGeometry, ...]
    resident_bytes: int
    transient_bytes: int
    vocab_size: int
    state_layers: tuple[StateLayerGeometry, ...] = ()
    prefill_seconds: tuple[float, float] | None = None

    def beside(self, draft: ModelProfile) -> ModelProfile:
        """This model's profile with a draft model run beside it: the memory both hold (each
        profile measured everything loaded, so the larger) and the larger transient peak,
        as their passes do not overlap."""
        return ModelProfile(
            self.layers,
            max(self.resident_bytes, draft.resident_bytes),
            max(self.transient_bytes, draft.transient_bytes),
            self.vocab_size,
            self.state_layers,
            self.prefill_seconds,
        )


@dataclass(frozen=True)
class CacheGeometry:
    """What a model's caches hold per position and per sequence.

    Attributes:
        layers: each attention part's key/value geometry.
        state_layers: each state part's array geometry.
    """

    layers: tuple[LayerGeometry, ...]
    state_layers: tuple[StateLayerGeometry, ...]


@dataclass(frozen=True)
class PassMeasurement:
    """One forward pass over caches that store nothing.

    Attributes:
        num_tokens: the pass's tokens (one sequence, no prior context).
        transient_bytes: its peak above the memory held before it.
        geometry: what its caches would hold (`trace_cache_geometry`).
        num_query_heads: the most query heads of a layer whose attention came through its
            cache (0 when none did).
        vocab_size: the width of the logits.
        seconds: its wall time, logits evaluated.
    """

    num_tokens: int
    transient_bytes: int
    geometry: CacheGeometry
    num_query_heads: int
    vocab_size: int
    seconds: float


def measure_pass(
    model: LanguageModel, num_tokens: int, layout: CacheLayout | None = None
) -> PassMeasurement:
    """Run `num_tokens` tokens through `model` once, last position's logits only, and
    measure the pass; nothing is cached, so the peak is the activations' alone.

    Args:
        model: the model, weights evaluated.
        num_tokens: tokens of the pass (>= 1).
        layout: the model's cache layout; None takes the model's own.

    Raises:
        ValueError: as `trace_cache_geometry`.
    """
    mx.synchronize()
    resident = mx.get_active_memory()
    mx.reset_peak_memory()
    start = time.perf_counter()
    logits, geometry, num_query_heads = _trace(model, num_tokens, layout)
    mx.eval(logits)
    seconds = time.perf_counter() - start
    return PassMeasurement(
        num_tokens,
        max(mx.get_peak_memory() - resident, 0),
        geometry,
        num_query_heads,
        logits.shape[-1],
        seconds,
    )


def attention_bytes(
    layers: tuple[LayerGeometry, ...],
    num_query_heads: int,
    *,
    chunk_tokens: int,
    context_tokens: int,
) -> int:
    """Transient bytes of one layer's attention for a chunk at the end of a context: the
    float32 scores and probabilities of every query head over the context, and the
    context's keys and values gathered from the cache (the largest layer's); 0 without
    attention layers."""
    if not layers:
        return 0
    scores = _SCORE_ARRAYS * num_query_heads * chunk_tokens * context_tokens * _SCORE_DTYPE.size
    gathered = max(
        context_tokens * layer.num_kv_heads * (layer.key_dim + layer.value_dim) * layer.dtype.size
        for layer in layers
    )
    return scores + gathered


def profile_model(
    model: LanguageModel,
    num_tokens: int,
    layout: CacheLayout | None = None,
    *,
    context_tokens: int | None = None,
) -> ModelProfile:
    """Measure `model` with two passes of a few tokens and scale the largest step from them.

    The passes (`RECORDING_TOKENS`, or `num_tokens` and fewer where that is smaller) record
    the caches' geometry (keys and values per attention part, state arrays per state part;
    it does not depend on the tokens) and give the transient peak's growth per token and
    its part that does not grow; the step of `num_tokens` at the end of `context_tokens`
    adds `attention_bytes` over the whole context. Against a measured pass of the whole
    chunk (no prior context) this came out 1.2-2.4x above it, never below, on
    SmolLM2-135M with dense and quantized weights at 128 and 512 tokens, and never below
    on the tiny test models, whose attention scores dominate
    (tests/models/test_memory_estimate.py): an upper estimate, as the KV budget needs,
    for a few milliseconds of work.

    Args:
        model: the language model, weights evaluated.
        num_tokens: the largest prefill chunk (tokens).
        layout: what each of the model's layers keeps, in its cache list's order; None
            takes the model's own (`model_cache_layout`).
        context_tokens: the context that chunk ends (tokens); None: the chunk alone.

    Raises:
        ValueError: `num_tokens` < 1 or `context_tokens` < `num_tokens`, an attention part
            stored no keys and values, or a state part wrote no state.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    context = num_tokens if context_tokens is None else context_tokens
    if context < num_tokens:
        raise ValueError(f"context_tokens must be >= num_tokens ({num_tokens}), got {context}")
    if layout is None:
        layout = model_cache_layout(model)
    small, large = (min(n, num_tokens) for n in RECORDING_TOKENS)
    mx.synchronize()
    resident = mx.get_active_memory()
    first = measure_pass(model, small, layout)
    second = first if large == small else measure_pass(model, large, layout)
    layers = second.geometry.layers
    # A model whose attention does not come through its caches: count its KV heads.
    num_query_heads = max([second.num_query_heads, *(layer.num_kv_heads for layer in layers)])

    # The passes' own attention is small; counting it in their growth keeps this an upper
    # estimate.
    growth = second.transient_bytes - first.transient_bytes
    per_token = 0.0 if large == small else max(growth, 0) / (large - small)
    fixed = max(first.transient_bytes - per_token * small, 0)
    attention = attention_bytes(
        layers, num_query_heads, chunk_tokens=num_tokens, context_tokens=context
    )
    scaled = _MEASUREMENT_HEADROOM * (fixed + per_token * num_tokens)
    transient = int(scaled) + MEASUREMENT_SLACK_BYTES + attention
    timing = None
    if large > small:
        seconds_per_token = max(second.seconds - first.seconds, 0.0) / (large - small)
        timing = (max(first.seconds - seconds_per_token * small, 0.0), seconds_per_token)
    return ModelProfile(
        layers, resident, transient, second.vocab_size, second.geometry.state_layers, timing
    )


def trace_cache_geometry(
    model: LanguageModel, num_tokens: int = 1, layout: CacheLayout | None = None
) -> tuple[mx.array, CacheGeometry]:
    """Build one forward pass of `num_tokens` tokens through recording caches, without
    evaluating it: MLX infers every array's shape and dtype as the graph is built, so
    the geometry is known before (and without) any computation.

    Args:
        model: the model.
        num_tokens: tokens of the pass (>= 1).
        layout: what each of the model's layers keeps, in its cache list's order; None
            takes the model's own (`model_cache_layout`).

    Returns:
        The pass's (1, 1, V) logits, unevaluated, and the caches' geometry.

    Raises:
        ValueError: an attention part stored no keys and values, or a state part wrote no
            state.
    """
    logits, geometry, _ = _trace(model, num_tokens, layout)
    return logits, geometry


def _trace(
    model: LanguageModel, num_tokens: int, layout: CacheLayout | None
) -> tuple[mx.array, CacheGeometry, int]:
    """`trace_cache_geometry`, and the most query heads an attention part computed."""
    if layout is None:
        layout = model_cache_layout(model)
    parts = [[_recording_cache(part) for part in layer] for layer in layout.layers]
    caches = [layer[0] if len(layer) == 1 else CompositeCache(layer) for layer in parts]
    logits = model(mx.zeros((1, num_tokens), dtype=mx.int32), caches, last_only=True)
    recorded = [cache for layer in parts for cache in layer]
    attention = [cache for cache in recorded if isinstance(cache, _RecordingCache)]
    layers = tuple(cache.geometry for cache in attention if cache.geometry is not None)
    if len(layers) != len(attention):
        raise ValueError("the model stored no keys and values in some of its attention layers")
    states = tuple(c.geometry for c in recorded if isinstance(c, _RecordingStateCache))
    if any(all(array is None for array in state) for state in states):
        raise ValueError("the model wrote no state in some of its state layers")
    num_query_heads = max((cache.num_query_heads for cache in attention), default=0)
    return logits, CacheGeometry(layers, states), num_query_heads
