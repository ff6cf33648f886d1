"""The engine's settings, and the KV cache size they and the device's memory allow."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlxcel_core.cache.paged import PagedKVStorage, residual_blocks_per_row
from mlxcel_core.cache.quant import AUTO, check_cache_type, is_quantized
from mlxcel_core.engine.memory import ModelProfile, device_memory_bytes, plan_num_blocks
from mlxcel_core.engine.scheduler import SchedulerConfig
from mlxcel_core.speculative import SpeculativeConfig

# vLLM's largest block size. The KV pools grow by whole blocks, at least 16 at a time, so a
# far larger block costs gigabytes before the first token.
MAX_BLOCK_SIZE = 256


class InsufficientMemoryError(ValueError):
    """The KV cache budget cannot hold even one sequence of the context size."""


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the engine.

    Attributes:
        scheduler: step limits (sequences at once, tokens per step, prefill chunk).
        context_size: the longest sequence (tokens) the KV cache must be able to hold.
        block_size: tokens per KV block, at most `MAX_BLOCK_SIZE`.
        num_kv_blocks: KV blocks to use, null block included; None plans them from memory.
        memory_utilization: the fraction of device memory weights, activations and the KV
            cache may take together, in (0, 1].
        device_memory: the device's memory (bytes); None asks MLX (RAM on the CPU).
        enable_prefix_caching: reuse the KV of full blocks seen before.
        max_waiting: most sequences waiting to run, beyond those the free running slots
            (`scheduler.max_num_seqs`) take at once; a submission that would exceed it
            raises `EngineOverloadedError`.
        retry_after_seconds: the retry hint carried by `EngineOverloadedError`.
        max_consecutive_failures: failing steps in a row after which the engine stops.
        speculative: speculative decoding settings, or None to decode one token per step.
        cache_type_k: how the KV cache stores keys, one of
            `mlxcel_core.cache.quant.CACHE_TYPES`; "auto" keeps the model's own dtype.
        cache_type_v: how the KV cache stores values.
        cache_residual: positions at the end of each sequence whose quantized keys and
            values are also kept exact (a residual window, `cache.paged.residual`); 0
            keeps none. Needs a quantized `cache_type_k` or `cache_type_v`.
        paged_decode_kernel: decode passes attend straight from the KV pools where a
            kernel serves the device (`PagedKVStorage`'s `decode_kernel`); False keeps
            gathering each row's keys and values, then attending.
        async_scheduling: schedule and launch each step while the device computes the one
            before, reading tokens one step late (`mlxcel_core.engine.core`); the tokens
            are the same as with False, which reads every step before planning the next.
            Speculative decoding and runners that send their rows to other ranks always
            run synchronously.

    Raises:
        ValueError: a setting is out of range.
    """

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    context_size: int = 4096
    block_size: int = 16
    num_kv_blocks: int | None = None
    memory_utilization: float = 0.9
    device_memory: int | None = None
    enable_prefix_caching: bool = True
    max_waiting: int = 64
    retry_after_seconds: int = 1
    max_consecutive_failures: int = 3
    cache_type_k: str = AUTO
    cache_type_v: str = AUTO
    cache_residual: int = 0
    paged_decode_kernel: bool = True
    async_scheduling: bool = True
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        for name in ("context_size", "block_size", "max_waiting", "max_consecutive_failures"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.block_size > MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be <= {MAX_BLOCK_SIZE}, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be None or >= 2, got {self.num_kv_blocks}")
        if not 0.0 < self.memory_utilization <= 1.0:
            raise ValueError(f"memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if self.retry_after_seconds < 0:
            raise ValueError(f"retry_after_seconds must be >= 0, got {self.retry_after_seconds}")
        check_cache_type("cache_type_k", self.cache_type_k)
        check_cache_type("cache_type_v", self.cache_type_v)
        if self.cache_residual < 0:
            raise ValueError(f"cache_residual must be >= 0, got {self.cache_residual}")
        if self.cache_residual and not (
            is_quantized(self.cache_type_k) or is_quantized(self.cache_type_v)
        ):
            raise ValueError(
                "cache_residual keeps exact copies beside a quantized cache; it needs "
                "cache_type_k or cache_type_v to be q8_0, q4_0, turbo2, turbo3 or turbo4"
            )

    @property
    def num_residual_blocks(self) -> int:
        """Residual blocks the KV storage allocates: twice what every running sequence's
        window (at most the context) can touch, so that those of finished sequences are
        not the only spare."""
        window = min(self.cache_residual, self.context_size)
        per_row = residual_blocks_per_row(window, self.block_size)
        return 2 * self.scheduler.max_num_seqs * per_row

    def residual_bytes(self, profile: ModelProfile) -> int:
        """Bytes the residual blocks take (`LayerGeometry.exact_bytes_per_token`)."""
        if not self.cache_residual:
            return 0
        positions = (self.num_residual_blocks + 1) * self.block_size
        return positions * sum(
            layer.exact_bytes_per_token(self.cache_type_k, self.cache_type_v)
            for layer in profile.layers
        )


def plan_kv_blocks(
    config: EngineConfig, profile: ModelProfile, draft: ModelProfile | None = None
) -> int:
    """KV blocks (null block included): `config.num_kv_blocks`, else what memory allows.

    Blocks are counted at their stored size, so smaller cache types fit more of them. With
    a draft model (speculative decoding) a block also holds the draft's KV, in its own dtype,
    and both models' weights and the larger of their transient peaks are set aside.

    Raises:
        InsufficientMemoryError: they cannot hold one sequence of `config.context_size`.
        CacheTypeError: a cache type cannot take a layer's head dim.
    """
    num_blocks = config.num_kv_blocks
    residual_bytes = 0
    if num_blocks is None:
        memory = device_memory_bytes() if config.device_memory is None else config.device_memory
        bytes_per_token = sum(
            layer.bytes_per_token(config.cache_type_k, config.cache_type_v)
            for layer in profile.layers
        )
        residual_bytes = config.residual_bytes(profile)
        if draft is not None:
            bytes_per_token += sum(layer.bytes_per_token() for layer in draft.layers)
            profile = profile.beside(draft)
        block_bytes = config.block_size * bytes_per_token
        num_blocks = plan_num_blocks(
            usable_bytes=int(memory * config.memory_utilization) - residual_bytes,
            profile=profile,
            bytes_per_block=block_bytes,
        )
    needed = math.ceil(config.context_size / config.block_size) + 1
    if num_blocks < needed:
        residual = ""
        if residual_bytes:
            residual = (
                f" (the cache_residual window's exact copies take {residual_bytes / 2**20:.1f} "
                "MiB of its memory: lower cache_residual or max_num_seqs)"
            )
        raise InsufficientMemoryError(
            f"the KV cache has room for {max(num_blocks - 1, 0) * config.block_size} tokens "
            f"({num_blocks} blocks of {config.block_size}, one reserved){residual} "
            f"but one sequence of the context size ({config.context_size} tokens) needs "
            f"{(needed - 1) * config.block_size}; lower the context size or give the "
            "cache more memory"
        )
    return num_blocks


def make_kv_storage(config: EngineConfig, profile: ModelProfile, num_blocks: int) -> PagedKVStorage:
    """The KV pools of `profile`'s layers: `num_blocks` blocks of `config.block_size`
    positions, in `config`'s key and value cache types.

    Raises:
        CacheTypeError: a cache type cannot take a layer's head dim.
    """
    return PagedKVStorage(
        profile.layers,
        config.block_size,
        num_blocks,
        cache_type_k=config.cache_type_k,
        cache_type_v=config.cache_type_v,
        decode_kernel=config.paged_decode_kernel,
        residual_window=config.cache_residual,
        # More than one per block is never used.
        num_residual_blocks=min(config.num_residual_blocks, num_blocks),
    )
