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
from mlxcel_core.cache.paged import LayerGeometry
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


@dataclass(frozen=True)
class ModelProfile:
    """What one profiling forward pass measured.

    Attributes:
        layers: each attention layer's key/value geometry.
        resident_bytes: memory MLX held before the pass (the weights, mostly).
        transient_bytes: the pass's peak above that (activations of one prefill chunk).
        vocab_size: the width of the model's logits.
    """

    layers: tuple[LayerGeometry, ...]
    resident_bytes: int
    transient_bytes: int
    vocab_size: int

    def beside(self, draft: ModelProfile) -> ModelProfile:
        """This model's profile with a draft model run beside it: the memory both hold (each
        profile measured everything loaded, so the larger) and the larger transient peak,
        as their passes do not overlap."""
        return ModelProfile(
            self.layers,
            max(self.resident_bytes, draft.resident_bytes),
            max(self.transient_bytes, draft.transient_bytes),
            self.vocab_size,
        )


def profile_model(model: LanguageModel, num_tokens: int) -> ModelProfile:
    """Run `num_tokens` tokens through `model` once and measure it.

    Raises:
        ValueError: `num_tokens` < 1, or the model stored no keys and values.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    caches = [_RecordingCache() for _ in model.make_cache()]
    mx.synchronize()
    resident = mx.get_active_memory()
    mx.reset_peak_memory()
    logits = model(mx.zeros((1, num_tokens), dtype=mx.int32), caches, last_only=True)
    mx.eval(logits)
    transient = max(mx.get_peak_memory() - resident, 0)
    layers = tuple(cache.geometry for cache in caches if cache.geometry is not None)
    if len(layers) != len(caches):
        raise ValueError("the model stored no keys and values in some of its layers")
    return ModelProfile(layers, resident, transient, logits.shape[-1])


def plan_num_blocks(*, usable_bytes: int, profile: ModelProfile, bytes_per_block: int) -> int:
    """KV blocks that fit in `usable_bytes` beside the weights and one step's transients.

    Returns:
        The number of blocks, the null block included; may be < 2 when nothing fits.
    """
    free = usable_bytes - profile.resident_bytes - profile.transient_bytes
    return max(free // bytes_per_block, 0)
