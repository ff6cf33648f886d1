"""Memory a model will take once loaded, from its headers: weights, KV cache, activations.

Weights follow what the loader does on the device (`ComputeOptions`): the file's dtypes,
or on the CPU float32 floats and, when they fit, quantized layers made dense float32
(docs/adr/0004). The KV cache is counted as the paged engine stores it, in blocks, at the
cache types' packed sizes, per block group (`mlxcel_core.cache.block_groups`): a
full-attention layer keeps every position of a sequence, a sliding-window layer only its
window and a prefill chunk; recurrent layers keep one state per sequence
(`cache_geometry`). Beside a quantized cache type, the residual window's exact copies of
each running sequence's last positions are counted as the engine sets them aside
(`mlxcel_core.engine.config.residual_window_bytes`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.cache.block_groups import BlockGroups
from mlxcel_core.cache.paged import LayerGeometry
from mlxcel_core.cache.quant import check_cache_type
from mlxcel_core.cache.state import state_bytes_per_sequence
from mlxcel_core.engine.config import (
    kept_residual_window,
    residual_window_bytes,
    resolve_residual_window,
)
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.memory.cache_geometry import ModelCacheGeometry, model_cache_geometry
from mlxcel_models.memory.inventory import ModelInventory, WeightTensor

# mx.fast.scaled_dot_product_attention's scores and probabilities, where it materializes them.
_SCORE_DTYPE_SIZE = mx.float32.size


@dataclass(frozen=True)
class WeightEstimate:
    """The weights' size on disk and in memory.

    Attributes:
        file_bytes: their files' size on disk.
        resident_bytes: what the loaded parameters take on the device (bytes).
        num_parameters: values, counting quantized ones unpacked.
        dense: quantized layers are made dense at load (the CPU, when they fit).
        dtype: the float dtype of the parameters once loaded; None keeps the file's.
    """

    file_bytes: int
    resident_bytes: int
    num_parameters: int
    dense: bool
    dtype: mx.Dtype | None


def _quantized_resident_bytes(tensor: WeightTensor, float_dtype: mx.Dtype) -> int:
    # Packed codes, then one scale and one bias per group (MLX's affine quantization).
    groups = tensor.num_elements // tensor.group_size
    return tensor.num_elements * tensor.bits // 8 + 2 * groups * float_dtype.size


def estimate_weights(inventory: ModelInventory, options: ComputeOptions) -> WeightEstimate:
    """The loaded size of `inventory`'s weights under `options` (as `apply_compute_options`)."""
    quantized = [t for t in inventory.tensors if t.is_quantized]
    dense_dtype = options.dense_dtype
    dense = bool(quantized) and options.makes_dense(
        sum(t.num_elements for t in quantized) * dense_dtype.size
    )
    resident = 0
    for tensor in inventory.tensors:
        float_dtype = options.float_dtype or tensor.dtype
        if not tensor.is_quantized:
            resident += tensor.num_elements * float_dtype.size
        elif dense:
            resident += tensor.num_elements * dense_dtype.size
        else:
            resident += _quantized_resident_bytes(tensor, float_dtype)
    return WeightEstimate(
        file_bytes=inventory.file_bytes,
        resident_bytes=resident,
        num_parameters=sum(t.num_elements for t in inventory.tensors),
        dense=dense,
        dtype=options.float_dtype,
    )


def activation_dtype(inventory: ModelInventory, options: ComputeOptions) -> mx.Dtype:
    """The dtype of the model's activations, hence of the keys and values it makes: the
    compute dtype, or the type the key path's weights promote to (MLX's promotion rules)."""
    if options.float_dtype is not None:
        return options.float_dtype
    return functools.reduce(mx.result_type, inventory.key_path_dtypes or (mx.float32,))


def cache_geometry(inventory: ModelInventory, options: ComputeOptions) -> ModelCacheGeometry:
    """The model's cache layout, its attention layers' key/value geometry and its state
    layers' arrays, as the engine's profiling pass records them (`Architecture.kv_geometry`
    for multi-head latent attention)."""
    arch = inventory.architecture
    dtype = activation_dtype(inventory, options)
    if arch.kv_geometry is not None:
        geometry = LayerGeometry(*arch.kv_geometry, dtype)
    else:
        geometry = LayerGeometry(arch.num_kv_heads, arch.head_dim, arch.head_dim, dtype)
    return model_cache_geometry(inventory, options, (geometry,) * arch.num_layers)


def kv_layers(inventory: ModelInventory, options: ComputeOptions) -> tuple[LayerGeometry, ...]:
    """Each attention layer's key/value geometry, as the engine's profiling pass records it."""
    return cache_geometry(inventory, options).layers


def kv_bytes_per_token(
    layers: tuple[LayerGeometry, ...], cache_type_k: str, cache_type_v: str
) -> int:
    """Key plus value bytes one position takes over all layers (`LayerGeometry`'s count).

    Raises:
        ValueError: a cache type is unknown; `CacheTypeError` where it cannot take the
            layers' head dim.
    """
    return sum(layer.bytes_per_token(cache_type_k, cache_type_v) for layer in layers)


def kv_cache_bytes(
    bytes_per_token: int, num_tokens: int, block_size: int, num_sequences: int = 1
) -> int:
    """Bytes of the blocks the engine needs to hold `num_sequences` sequences of
    `num_tokens` positions each, its null block included (as `plan_kv_blocks` counts them)."""
    num_blocks = num_sequences * math.ceil(num_tokens / block_size) + 1
    return num_blocks * block_size * bytes_per_token


def kv_group_bytes_per_token(
    geometry: ModelCacheGeometry, cache_type_k: str, cache_type_v: str
) -> list[tuple[int | None, int]]:
    """Each block group's window (None: full attention) and the key plus value bytes one
    position takes over its layers.

    Raises:
        ValueError: a cache type is unknown; `CacheTypeError` where it cannot take a
            layer's head dim.
    """
    groups = BlockGroups.of([geometry.layout])
    per_token = [0] * groups.num_groups
    for layer, group in zip(geometry.layers, groups.layer_groups(geometry.layout), strict=True):
        per_token[group] += layer.bytes_per_token(cache_type_k, cache_type_v)
    return list(zip(groups.windows, per_token, strict=True))


def sequences_kv_bytes(
    geometry: ModelCacheGeometry,
    request: ContextRequest,
    tokens: int,
    *,
    cache_type_k: str,
    cache_type_v: str,
    num_sequences: int = 1,
) -> int:
    """Bytes of the KV blocks `num_sequences` sequences of `tokens` positions hold at once,
    each block group's (`ContextRequest.tokens_held`) with its null block.

    Raises:
        ValueError: a cache type is unknown; `CacheTypeError` where it cannot take a
            layer's head dim.
    """
    return sum(
        kv_cache_bytes(
            per_token, request.tokens_held(tokens, window), request.block_size, num_sequences
        )
        for window, per_token in kv_group_bytes_per_token(geometry, cache_type_k, cache_type_v)
    )


def activation_bytes(
    inventory: ModelInventory, dtype: mx.Dtype, *, chunk_tokens: int, context_tokens: int
) -> int:
    """Transient bytes of the largest step: a prefill chunk at the end of a full context.

    Counts, in `dtype`, the residual stream (input, normed copy, layer output), then the
    larger of a layer's attention (queries, keys and values of the chunk, the row's whole
    context gathered from the cache, and three float32 arrays of every head's scores over
    that context: scores, masked scores, probabilities) and its MLP (gate, up and their
    product), and one float32 row of logits. Fused attention kernels that do not
    materialize the scores need less.
    """
    arch = inventory.architecture
    U, C, D = chunk_tokens, context_tokens, arch.head_dim
    residual = 3 * U * arch.hidden_size * dtype.size
    projections = U * (arch.num_heads + 2 * arch.num_kv_heads) * D * dtype.size
    context = 2 * C * arch.num_kv_heads * D * dtype.size
    scores = 3 * arch.num_heads * U * C * _SCORE_DTYPE_SIZE
    mlp = 3 * U * arch.intermediate_size * dtype.size
    logits = arch.vocab_size * _SCORE_DTYPE_SIZE
    return residual + max(projections + context + scores, mlp) + logits


@dataclass(frozen=True)
class MemoryEstimate:
    """What a model with one full context needs (bytes).

    Attributes:
        weights: the resident weights.
        kv_cache: the KV blocks of one sequence of the context size.
        activations: the largest step's transient memory.
        states: the recurrent state of the sequences counted (0 without state layers).
        residual: the residual window's exact copies of the sequences counted (0 without
            a window).
    """

    weights: int
    kv_cache: int
    activations: int
    states: int = 0
    residual: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.residual + self.activations + self.states

    def beside(self, draft: MemoryEstimate) -> MemoryEstimate:
        """With a draft model run beside it (speculative decoding): both models' weights and
        KV caches, and the larger step, as their passes do not overlap."""
        return MemoryEstimate(
            self.weights + draft.weights,
            self.kv_cache + draft.kv_cache,
            max(self.activations, draft.activations),
            self.states + draft.states,
            self.residual + draft.residual,
        )


@dataclass(frozen=True)
class ContextRequest:
    """The settings an estimate depends on, as the engine's flags give them.

    Attributes:
        context_size: tokens of one sequence (`-c`; 0 = the model's trained context).
        chunk_tokens: prompt tokens per prefill chunk (the smaller of `-ub` and `-b`).
        block_size: tokens per KV block.
        cache_type_k: how keys are stored (`mlxcel_core.cache.quant.CACHE_TYPES`).
        cache_type_v: how values are stored.
        cache_residual: positions at the end of each sequence kept exact beside a
            quantized type (`--cache-residual`); None resolves to the types' default on
            the default device, as `EngineConfig` resolves it.

    Raises:
        ValueError: a count is out of range, a cache type is unknown, or the residual
            window is negative or given without a quantized type.
    """

    context_size: int
    chunk_tokens: int = 512
    block_size: int = 16
    cache_type_k: str = "auto"
    cache_type_v: str = "auto"
    cache_residual: int | None = None

    def __post_init__(self) -> None:
        if self.context_size < 0:
            raise ValueError(f"context_size must be >= 0, got {self.context_size}")
        for name in ("chunk_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_cache_type("cache_type_k", self.cache_type_k)
        check_cache_type("cache_type_v", self.cache_type_v)
        window = resolve_residual_window(self.cache_type_k, self.cache_type_v, self.cache_residual)
        object.__setattr__(self, "cache_residual", window)

    def tokens(self, inventory: ModelInventory) -> int:
        """The context size in tokens, the trained one for 0."""
        return self.context_size or inventory.architecture.context_length

    def residual_window(self, tokens: int) -> int:
        """Positions kept exact at the end of a sequence of `tokens`
        (`kept_residual_window`, as the engine keeps them)."""
        return kept_residual_window(self.cache_residual, tokens)

    def tokens_held(self, tokens: int, window: int | None) -> int:
        """Positions whose blocks one sequence of `tokens` holds at once in a block group:
        all of them, or, in a group of layers with a window, its window before a chunk,
        the chunk, and the blocks the two start inside of (as
        `EngineConfig.blocks_per_sequence` counts them)."""
        if window is None:
            return tokens
        return min(tokens, window - 1 + self.chunk_tokens + 2 * self.block_size)


def sequences_residual_bytes(
    geometry: ModelCacheGeometry, request: ContextRequest, tokens: int, num_sequences: int = 1
) -> int:
    """Bytes of the residual window's exact copies for `num_sequences` running sequences
    of `tokens` positions, counted as the engine sets them aside
    (`EngineConfig.residual_bytes`); 0 without a window."""
    return residual_window_bytes(
        geometry.layers,
        request.cache_type_k,
        request.cache_type_v,
        window=request.residual_window(tokens),
        block_size=request.block_size,
        num_sequences=num_sequences,
    )


def estimate_memory(
    inventory: ModelInventory,
    request: ContextRequest,
    options: ComputeOptions,
    *,
    running_sequences: int = 1,
    full_contexts: int = 1,
) -> MemoryEstimate:
    """Weights, the KV blocks of `full_contexts` sequences of the full context, the largest
    step's activations, and the residual windows' exact copies and recurrent states of
    `running_sequences` sequences decoded at once, which the engine sets aside whatever
    their lengths (`EngineConfig.residual_bytes`, `EngineConfig.state_bytes`).

    Raises:
        ValueError: a cache type is unknown, or a count is < 1; `CacheTypeError` where a
            cache type cannot take the model's head dim.
    """
    for name, count in (("running_sequences", running_sequences), ("full_contexts", full_contexts)):
        if count < 1:
            raise ValueError(f"{name} must be >= 1, got {count}")
    tokens = request.tokens(inventory)
    geometry = cache_geometry(inventory, options)
    return MemoryEstimate(
        weights=estimate_weights(inventory, options).resident_bytes,
        kv_cache=sequences_kv_bytes(
            geometry,
            request,
            tokens,
            cache_type_k=request.cache_type_k,
            cache_type_v=request.cache_type_v,
            num_sequences=full_contexts,
        ),
        states=running_sequences * state_bytes_per_sequence(geometry.state_layers),
        residual=sequences_residual_bytes(geometry, request, tokens, running_sequences),
        activations=activation_bytes(
            inventory,
            activation_dtype(inventory, options),
            chunk_tokens=min(request.chunk_tokens, tokens),
            context_tokens=tokens,
        ),
    )
