"""The engine's settings, and the KV cache size they and the device's memory allow."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from mlxcel_core.cache.layout import CacheLayout
from mlxcel_core.cache.paged import LayerGeometry, PagedKVStorage, residual_blocks_per_row
from mlxcel_core.cache.quant import AUTO, check_cache_type, is_quantized, is_turbo
from mlxcel_core.cache.state import state_bytes_per_sequence
from mlxcel_core.engine.memory import ModelProfile, device_memory_bytes, profile_model
from mlxcel_core.engine.scheduler import SchedulerConfig
from mlxcel_core.errors import InputError
from mlxcel_core.kernels.options import kernel_backend
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.speculative import SpeculativeConfig

# The smallest prefill chunk a time limit lowers `max_prefill_chunk` to: one KV block of
# the default size, so slow devices still make progress on a prompt.
MIN_PREFILL_CHUNK = 16
# vLLM's largest block size. The KV pools grow by whole blocks, at least 16 at a time, so a
# far larger block costs gigabytes before the first token.
MAX_BLOCK_SIZE = 256
# Positions kept exact by default beside a quantized KV cache (docs/adr/0040): decoding
# SmolLM2, q8_0 loses +0.02% perplexity against f16 with it and +0.15% without, q4_0
# +1.5% against +8.6%, turbo4 +0.8% against +2.8%.
DEFAULT_RESIDUAL_WINDOW = 16


class InsufficientMemoryError(InputError, ValueError):
    """The KV cache budget cannot hold even one sequence of the context size."""


def default_residual_window(
    cache_type_k: str, cache_type_v: str, device: mx.Device | None = None
) -> int:
    """The residual window a KV cache of these types keeps unless told otherwise:
    `DEFAULT_RESIDUAL_WINDOW` where a side is quantized, 0 where neither is, and 0 where
    both sides are TurboQuant and `device` (None: the default device) has the kernels
    that decode straight from their codes, which read the codes alone and would give way
    to the gather path."""
    if not (is_quantized(cache_type_k) or is_quantized(cache_type_v)):
        return 0
    kernels = kernel_backend(device or mx.default_device()) is not None
    if kernels and is_turbo(cache_type_k) and is_turbo(cache_type_v):
        return 0
    return DEFAULT_RESIDUAL_WINDOW


def resolve_residual_window(
    cache_type_k: str, cache_type_v: str, cache_residual: int | None
) -> int:
    """The residual window a KV cache of these types keeps: `cache_residual`, or for None
    the types' default on the default device (`default_residual_window`).

    Raises:
        ValueError: `cache_residual` is negative, or above 0 beside no quantized type.
    """
    if cache_residual is None:
        return default_residual_window(cache_type_k, cache_type_v)
    if cache_residual < 0:
        raise ValueError(f"cache_residual must be >= 0, got {cache_residual}")
    if cache_residual and not (is_quantized(cache_type_k) or is_quantized(cache_type_v)):
        raise ValueError(
            "cache_residual keeps exact copies beside a quantized cache; it needs "
            "cache_type_k or cache_type_v to be q8_0, q4_0, turbo2, turbo3 or turbo4"
        )
    return cache_residual


def kept_residual_window(cache_residual: int, context_tokens: int) -> int:
    """Positions kept exact at the end of a sequence of `context_tokens` with a residual
    window of `cache_residual`: the window, at most the context (a longer one keeps no
    more)."""
    return min(cache_residual, context_tokens)


def num_residual_blocks(window: int, block_size: int, num_sequences: int) -> int:
    """Residual blocks the KV storage allocates for `num_sequences` running sequences with
    a window of `window` positions: twice what their windows can touch, so that those of
    finished sequences are not the only spare."""
    return 2 * num_sequences * residual_blocks_per_row(window, block_size)


def residual_window_bytes(
    layers: Sequence[LayerGeometry],
    cache_type_k: str,
    cache_type_v: str,
    *,
    window: int,
    block_size: int,
    num_sequences: int,
) -> int:
    """Bytes the residual blocks of `num_sequences` running sequences take over `layers`,
    the null residual block included: the exact copies of the quantized sides' keys or
    values (`LayerGeometry.exact_bytes_per_token`) of the last `window` positions of each
    sequence, in blocks of `block_size` (`num_residual_blocks`). 0 for a window of 0."""
    if not window:
        return 0
    positions = (num_residual_blocks(window, block_size, num_sequences) + 1) * block_size
    return positions * sum(
        layer.exact_bytes_per_token(cache_type_k, cache_type_v) for layer in layers
    )


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
            keeps none, None the types' default on the default device
            (`default_residual_window`). Above 0 it needs a quantized `cache_type_k` or
            `cache_type_v`.
        paged_decode_kernel: decode passes attend straight from the KV pools where a
            kernel serves the device (`PagedKVStorage`'s `decode_kernel`); False keeps
            gathering each row's keys and values, then attending.
        async_scheduling: schedule and launch each step while the device computes the one
            before, reading tokens one step late (`mlxcel_core.engine.core`); the tokens
            are the same as with False, which reads every step before planning the next.
            Speculative decoding and runners that send their rows to other ranks always
            run synchronously.
        max_prefill_seconds: lower `scheduler.max_prefill_chunk` so that a chunk takes
            about this long at most at the prefill speed measured at start-up
            (`prefill_chunk_for`); a request cancelled during a long prompt then frees
            its slot within that time. None keeps the chunk as given.

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
    cache_residual: int | None = None
    paged_decode_kernel: bool = True
    async_scheduling: bool = True
    max_prefill_seconds: float | None = None
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
        if self.max_prefill_seconds is not None and not self.max_prefill_seconds > 0:
            raise ValueError(
                f"max_prefill_seconds must be None or > 0, got {self.max_prefill_seconds}"
            )
        window = resolve_residual_window(self.cache_type_k, self.cache_type_v, self.cache_residual)
        object.__setattr__(self, "cache_residual", window)

    @property
    def residual_window(self) -> int:
        """Positions at the end of each sequence kept exact (`kept_residual_window`)."""
        return kept_residual_window(self.cache_residual, self.context_size)

    @property
    def num_residual_blocks(self) -> int:
        """Residual blocks the KV storage allocates for every running sequence's window
        (`residual_window`; `num_residual_blocks`)."""
        return num_residual_blocks(
            self.residual_window, self.block_size, self.scheduler.max_num_seqs
        )

    def residual_bytes(self, profile: ModelProfile) -> int:
        """Bytes the residual blocks take (`residual_window_bytes`)."""
        return residual_window_bytes(
            profile.layers,
            self.cache_type_k,
            self.cache_type_v,
            window=self.residual_window,
            block_size=self.block_size,
            num_sequences=self.scheduler.max_num_seqs,
        )

    def state_bytes(self, profile: ModelProfile) -> int:
        """Bytes the recurrent state slots take: one slot per running sequence."""
        return self.scheduler.max_num_seqs * state_bytes_per_sequence(profile.state_layers)

    def blocks_per_sequence(self, window: int | None) -> int:
        """Most blocks one sequence of `context_size` holds at once in a block group. In a
        group of layers with a window of `window` positions, blocks wholly behind the
        window are freed, so a sequence holds its first block, the window before a step's
        first new token, and the step's tokens (a prefill chunk, or a token and its
        drafts); None: every block."""
        whole = math.ceil(self.context_size / self.block_size)
        if window is None:
            return whole
        step_tokens = self.scheduler.max_prefill_chunk
        if self.speculative is not None:
            step_tokens = max(step_tokens, 1 + self.speculative.num_draft_tokens)
        return min(whole, 2 + math.ceil((window - 1 + step_tokens) / self.block_size))


def profile_largest_step(
    config: EngineConfig, model: LanguageModel, layout: CacheLayout | None = None
) -> ModelProfile:
    """`profile_model` for the largest step `config` runs: a prefill chunk of
    `scheduler.max_prefill_chunk` tokens (at most the context) at the end of a context of
    `context_size`. Every rank of a split model profiles alike, so the passes' collectives
    pair up."""
    chunk = min(config.scheduler.max_prefill_chunk, config.context_size)
    return profile_model(model, chunk, layout, context_tokens=config.context_size)


def prefill_chunk_for(config: EngineConfig, profile: ModelProfile) -> int:
    """The prompt tokens of one sequence per forward pass: `scheduler.max_prefill_chunk`,
    lowered to what `profile`'s measured prefill time (a fixed part plus a part per token)
    allows in `config.max_prefill_seconds`, but not below `MIN_PREFILL_CHUNK`."""
    chunk = config.scheduler.max_prefill_chunk
    if config.max_prefill_seconds is None or profile.prefill_seconds is None:
        return chunk
    fixed, per_token = profile.prefill_seconds
    budget = config.max_prefill_seconds - fixed
    if budget <= 0:
        return min(chunk, MIN_PREFILL_CHUNK)
    if per_token <= 0:
        return chunk
    return min(chunk, max(MIN_PREFILL_CHUNK, int(budget / per_token)))


def plan_kv_blocks(
    config: EngineConfig,
    profile: ModelProfile,
    draft: ModelProfile | None = None,
    *,
    kv_window: int | None = None,
) -> int:
    """KV blocks (null block included) of a cache of one block group: `plan_group_blocks`
    with every layer of both models in one group windowed by `kv_window`.

    Raises:
        InsufficientMemoryError: they cannot hold one sequence of `config.context_size`,
            or the state slots leave no room.
        CacheTypeError: a cache type cannot take a layer's head dim.
    """
    (num_blocks,) = plan_group_blocks(config, profile, draft, windows=(kv_window,))
    return num_blocks


def plan_group_blocks(
    config: EngineConfig,
    profile: ModelProfile,
    draft: ModelProfile | None = None,
    *,
    windows: Sequence[int | None] = (None,),
    layer_groups: Sequence[int] = (),
    draft_layer_groups: Sequence[int] = (),
) -> tuple[int, ...]:
    """KV blocks of each block group (null blocks included): fixed by
    `config.num_kv_blocks`, else what memory allows.

    Blocks are counted at their stored size, so smaller cache types fit more of them. With
    a draft model (speculative decoding) a block of a group also holds the draft's KV of
    its layers in that group, in its own dtype, and both models' weights and the larger of
    their transient peaks are set aside. The recurrent state slots
    (`EngineConfig.state_bytes`) and residual copies are set aside too. A model that keeps
    no keys and values (all its layers recurrent) gets blocks for bookkeeping only: enough
    for every running sequence's whole context.

    Group 0 (the widest, `BlockGroups`) takes `config.num_kv_blocks`, or what memory is
    left once the windowed groups have theirs: each of them room for the window and a
    step's tokens (`EngineConfig.blocks_per_sequence`) of every running sequence, the
    most it can ever hold at once (fewer sequences' worth where memory runs short, or
    `num_kv_blocks` if less).

    Args:
        config: the engine's settings.
        profile: the model's profile.
        draft: the draft model's profile, with speculative decoding by a draft model.
        windows: each group's window, widest first (None: full attention); a windowed
            group frees the blocks behind its window, so one sequence needs blocks for
            its window only.
        layer_groups: each of the model's attention layers' group; empty for group 0.
        draft_layer_groups: likewise for the draft model's layers.

    Raises:
        InsufficientMemoryError: group 0 cannot hold one sequence of
            `config.context_size` (the others then get as much), or the state slots
            leave no room.
        CacheTypeError: a cache type cannot take a layer's head dim.
    """
    seqs = config.scheduler.max_num_seqs
    # One sequence's blocks in each group, and its null block.
    needed = [config.blocks_per_sequence(window) + 1 for window in windows]
    per_token = _group_bytes_per_token(config, profile, draft, len(windows),
                                       layer_groups, draft_layer_groups)  # fmt: skip
    residual_bytes = state_bytes = 0
    if config.num_kv_blocks is not None:
        fixed = config.num_kv_blocks
        counts = [fixed, *(min(fixed, seqs * (n - 1) + 1) for n in needed[1:])]
    else:
        memory = device_memory_bytes() if config.device_memory is None else config.device_memory
        residual_bytes = config.residual_bytes(profile)
        state_bytes = config.state_bytes(profile)
        if draft is not None:
            profile = profile.beside(draft)
        usable = int(memory * config.memory_utilization) - residual_bytes - state_bytes
        free = usable - profile.resident_bytes - profile.transient_bytes
        if not any(per_token):
            counts = [seqs * (n - 1) + 1 if free >= 0 else 0 for n in needed]
        else:
            counts = _share_blocks(free, config.block_size, per_token, needed, seqs)
    # The windowed groups never need more than group 0, and get at least that much.
    if counts[0] < needed[0]:
        raise InsufficientMemoryError(
            f"the KV cache has room for {max(counts[0] - 1, 0) * config.block_size} tokens"
            f"{_group_name(windows)} ({counts[0]} blocks of {config.block_size}, one "
            f"reserved){_set_aside(residual_bytes, state_bytes)} but one sequence of the "
            f"context size ({config.context_size} tokens) needs "
            f"{(needed[0] - 1) * config.block_size}; lower the context size or give the "
            "cache more memory"
        )
    return tuple(counts)


def _group_bytes_per_token(
    config: EngineConfig,
    profile: ModelProfile,
    draft: ModelProfile | None,
    num_groups: int,
    layer_groups: Sequence[int],
    draft_layer_groups: Sequence[int],
) -> list[int]:
    """Key and value bytes one position takes in each group's layers, as stored."""
    per_token = [0] * num_groups
    types = (config.cache_type_k, config.cache_type_v)
    for layer, group in zip(profile.layers, layer_groups or [0] * len(profile.layers), strict=True):
        per_token[group] += layer.bytes_per_token(*types)
    if draft is not None:
        draft_groups = draft_layer_groups or [0] * len(draft.layers)
        for layer, group in zip(draft.layers, draft_groups, strict=True):
            per_token[group] += layer.bytes_per_token()
    return per_token


def _share_blocks(
    free: int, block_size: int, per_token: Sequence[int], needed: Sequence[int], seqs: int
) -> list[int]:
    """Blocks per group from `free` bytes: each windowed group (1 ..) room for the same
    number of running sequences (at most `seqs`, fewer if group 0 would then lack room
    for one sequence, but one at least), group 0 the rest."""
    block_bytes = [block_size * count for count in per_token]
    windowed = range(1, len(needed))
    null_bytes = sum(block_bytes[g] for g in windowed)
    sequence_bytes = sum((needed[g] - 1) * block_bytes[g] for g in windowed)
    room = free - null_bytes - needed[0] * block_bytes[0]
    fitting = seqs if not sequence_bytes else max(1, min(seqs, room // sequence_bytes))
    counts = [0, *((needed[g] - 1) * fitting + 1 for g in windowed)]
    rest = free - sum(counts[g] * block_bytes[g] for g in windowed)
    counts[0] = max(rest // block_bytes[0], 0) if block_bytes[0] else seqs * (needed[0] - 1) + 1
    return counts


def _group_name(windows: Sequence[int | None]) -> str:
    """Which layers a refusal speaks of, when some have a block group of their own."""
    if len(windows) == 1:
        return ""
    if windows[0] is None:
        return " in its full-attention layers"
    return f" in its layers with a window of {windows[0]}"


def _set_aside(residual_bytes: int, state_bytes: int) -> str:
    """What the memory plan set aside before the blocks, for the refusal's message."""
    parts = []
    if residual_bytes:
        parts.append(
            f"the cache_residual window's exact copies take {residual_bytes / 2**20:.1f} "
            "MiB of its memory: lower cache_residual or max_num_seqs"
        )
    if state_bytes:
        parts.append(
            f"the recurrent state slots take {state_bytes / 2**20:.1f} MiB of its memory: "
            "lower max_num_seqs"
        )
    return f" ({'; '.join(parts)})" if parts else ""


def make_kv_storage(
    config: EngineConfig,
    profile: ModelProfile,
    num_blocks: int | Sequence[int],
    *,
    windows: Sequence[int | None] = (None,),
    layer_groups: Sequence[int] = (),
) -> PagedKVStorage:
    """The KV pools of `profile`'s layers: `num_blocks` blocks of `config.block_size`
    positions (one count, or one per block group), in `config`'s key and value cache
    types.

    Args:
        windows: each block group's window (`PagedKVStorage`).
        layer_groups: each layer's block group; empty for group 0.

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
        num_residual_blocks=config.num_residual_blocks,
        state_layers=profile.state_layers,
        num_state_slots=config.scheduler.max_num_seqs,
        layer_groups=layer_groups,
        windows=windows,
    )


def check_cache_layout(
    layout: CacheLayout, config: EngineConfig, *, remote_prefill: bool = False
) -> None:
    """Refuse what a model with recurrent state layers cannot do (`CacheLayout`).

    Raises:
        ValueError: speculative decoding or disaggregated prefill for such a model.
    """
    if not layout.has_state:
        return
    if config.speculative is not None:
        raise ValueError(
            "speculative decoding is not supported for this model: its recurrent layers "
            "keep a state that cannot be rolled back past rejected draft tokens"
        )
    if remote_prefill:
        raise ValueError(
            "disaggregated prefill is not supported for this model: the prefill rank "
            "returns keys and values, not its recurrent layers' state"
        )
