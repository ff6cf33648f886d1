"""Memory admission: how many KV blocks fit beside the weights and a step's activations.

The budget follows vLLM's profile run: measure what the weights already hold, run one
forward pass of the largest prefill chunk and measure its transient peak, and give the KV
cache what is left of the usable device memory.
"""

from __future__ import annotations

import os
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
from mlxcel_core.generate import LanguageModel


def device_memory_bytes() -> int:
    """The default device's memory: MLX's figure for a GPU, physical RAM for the CPU."""
    size = mx.device_info().get("memory_size")
    if isinstance(size, int) and size > 0:
        return size
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class _RecordingCache:
    """A one-pass `KVCache` that notes each layer's key/value geometry."""

    def __init__(self) -> None:
        self.geometry: LayerGeometry | None = None
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
    """What one profiling forward pass measured.

    Attributes:
        layers: each attention layer's key/value geometry (the layout's attention parts).
        resident_bytes: memory MLX held before the pass (the weights, mostly).
        transient_bytes: the pass's peak above that (activations of one prefill chunk).
        vocab_size: the width of the model's logits.
        state_layers: each state layer's array geometry (the layout's state parts).
    """

    layers: tuple[LayerGeometry, ...]
    resident_bytes: int
    transient_bytes: int
    vocab_size: int
    state_layers: tuple[StateLayerGeometry, ...] = ()

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
        )


def profile_model(
    model: LanguageModel, num_tokens: int, layout: CacheLayout | None = None
) -> ModelProfile:
    """Run `num_tokens` tokens through `model` once and measure it.

    The geometry recorded (keys and values per attention part, state arrays per state
    part) does not depend on `num_tokens`: a pass of a few tokens records it as well.

    Args:
        model: the model.
        num_tokens: tokens of the pass.
        layout: what each of the model's layers keeps, in its cache list's order; None
            takes the model's own (`model_cache_layout`).

    Raises:
        ValueError: `num_tokens` < 1, an attention part stored no keys and values, or a
            state part wrote no state.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    mx.synchronize()
    resident = mx.get_active_memory()
    mx.reset_peak_memory()
    logits, geometry = trace_cache_geometry(model, num_tokens, layout)
    mx.eval(logits)
    transient = max(mx.get_peak_memory() - resident, 0)
    return ModelProfile(
        geometry.layers, resident, transient, logits.shape[-1], geometry.state_layers
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
    return logits, CacheGeometry(layers, states)
