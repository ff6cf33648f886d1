"""What each layer of a model keeps between forward passes: its cache kind.

Most layers are attention layers over the paged KV pool: full attention, which reads every
earlier position, sliding-window attention, which reads only the last `window_size`, or
chunked attention, which reads the earlier positions of its own chunk of `window_size`
(a window aligned to chunk boundaries: Llama 4's local layers).
Recurrent layers (Mamba's selective scan, gated delta nets, RWKV, short convolutions) keep
instead a few fixed-size state arrays per sequence, which the engine holds in state slots
beside the pool. A hybrid block may hold several caches at once (mlx-lm's `CacheList`,
e.g. a convolution state beside an attention layer's keys and values): its layer then has
several parts.

The kinds follow mlx-lm's cache classes (`mlx_lm/models/cache.py`): `KVCache` is full
attention, `RotatingKVCache(max_size=W)` a window of W positions, `ChunkedKVCache(W)`
chunks of W positions, `ArraysCache(size=N)` a state of N arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Protocol, runtime_checkable


class CacheKind(StrEnum):
    """What a layer's cache part keeps."""

    ATTENTION = "attention"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED = "chunked"
    STATE = "state"

    @property
    def stores_kv(self) -> bool:
        """Whether a part of this kind keeps keys and values in the paged pool."""
        return self is not CacheKind.STATE

    @property
    def can_rewind(self) -> bool:
        """Whether a part of this kind can be read as of an earlier position (a shared
        prefix's block boundary, the token before a rejected draft): keys and values keep
        each position apart; a recurrent state has absorbed every token it saw."""
        return self is not CacheKind.STATE


@dataclass(frozen=True)
class LayerCacheKind:
    """One cache part of a layer.

    Attributes:
        kind: full, sliding-window or chunked attention, or recurrent state.
        window_size: positions a sliding-window layer attends to (its own included), or
            a chunked layer's chunk; None for the other kinds.
        num_arrays: state arrays a state layer reads and writes by index (`cache[i]`);
            0 for the other kinds.

    Raises:
        ValueError: the window or array count does not fit the kind.
    """

    kind: CacheKind
    window_size: int | None = None
    num_arrays: int = 0

    def __post_init__(self) -> None:
        if self.kind in (CacheKind.SLIDING_WINDOW, CacheKind.CHUNKED):
            if self.window_size is None or self.window_size < 1:
                raise ValueError(
                    f"a {self.kind.value.replace('_', '-')} layer needs window_size >= 1, "
                    f"got {self.window_size}"
                )
        elif self.window_size is not None:
            raise ValueError(f"a {self.kind.value} layer takes no window_size")
        if self.kind is CacheKind.STATE:
            if self.num_arrays < 1:
                raise ValueError(f"a state layer needs num_arrays >= 1, got {self.num_arrays}")
        elif self.num_arrays:
            raise ValueError(f"a {self.kind.value} layer takes no num_arrays")

    @classmethod
    def attention(cls) -> LayerCacheKind:
        return cls(CacheKind.ATTENTION)

    @classmethod
    def sliding_window(cls, window_size: int) -> LayerCacheKind:
        return cls(CacheKind.SLIDING_WINDOW, window_size=window_size)

    @classmethod
    def chunked(cls, chunk_size: int) -> LayerCacheKind:
        return cls(CacheKind.CHUNKED, window_size=chunk_size)

    @classmethod
    def state(cls, num_arrays: int) -> LayerCacheKind:
        return cls(CacheKind.STATE, num_arrays=num_arrays)

    @property
    def stores_kv(self) -> bool:
        """Whether the part keeps keys and values in the paged pool."""
        return self.kind.stores_kv

    @property
    def kv_window(self) -> int | None:
        """Positions back from the newest whose keys and values the part reads from the
        pool: a sliding window's size; None for full attention, and for chunked
        attention too, whose model numbers its chunk mask's keys from position 0 (mlx-lm's
        `ChunkedKVCache.start_position`), so its blocks are all kept and read."""
        return self.window_size if self.kind is CacheKind.SLIDING_WINDOW else None


LayerCache = tuple[LayerCacheKind, ...]
"""One model layer's cache parts: one for a plain layer, several for a hybrid block."""


@dataclass(frozen=True)
class CacheLayout:
    """The cache parts of every layer of a model, in the order its `cache` list has them.

    Attention parts are numbered in order over the whole model (the paged storage's
    layers), and so are state parts (the state pool's layers).

    Attributes:
        layers: each model layer's parts, at least one each.

    Raises:
        ValueError: there are no layers, or a layer has no parts.
    """

    layers: tuple[LayerCache, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a cache layout needs at least one layer")
        for index, parts in enumerate(self.layers):
            if not parts:
                raise ValueError(f"layer {index} has no cache parts")

    @classmethod
    def all_attention(cls, num_layers: int) -> CacheLayout:
        """`num_layers` full-attention layers."""
        return cls(((LayerCacheKind.attention(),),) * num_layers)

    @classmethod
    def of(cls, layers: Sequence[Sequence[LayerCacheKind]]) -> CacheLayout:
        return cls(tuple(tuple(parts) for parts in layers))

    @cached_property
    def parts(self) -> tuple[LayerCacheKind, ...]:
        """Every part of every layer, in order."""
        return tuple(part for parts in self.layers for part in parts)

    @cached_property
    def attention_parts(self) -> tuple[LayerCacheKind, ...]:
        """The parts that keep keys and values, in storage-layer order."""
        return tuple(part for part in self.parts if part.stores_kv)

    @cached_property
    def state_parts(self) -> tuple[LayerCacheKind, ...]:
        """The parts that keep a recurrent state, in state-pool order."""
        return tuple(part for part in self.parts if not part.stores_kv)

    @cached_property
    def has_state(self) -> bool:
        """Whether some layer keeps a recurrent state."""
        return bool(self.state_parts)

    @cached_property
    def is_plain(self) -> bool:
        """Every layer is one attention part (full, windowed or chunked): the model's cache
        list is the paged storage's layers, one to one."""
        return all(len(parts) == 1 and parts[0].stores_kv for parts in self.layers)

    @cached_property
    def kinds(self) -> frozenset[CacheKind]:
        """The kinds of the model's parts."""
        return frozenset(part.kind for part in self.parts)

    @property
    def supports_prefix_caching(self) -> bool:
        """Whether sequences may share cached prefix blocks (`prefix_caching_with`)."""
        return prefix_caching_with(self.kinds)

    @property
    def supports_speculative_decoding(self) -> bool:
        """Whether rejected draft tokens can be rolled back (`speculative_decoding_with`)."""
        return speculative_decoding_with(self.kinds)

    @cached_property
    def kv_window(self) -> int | None:
        """Positions back from the newest that any attention part still reads: the
        largest window when every attention part is windowed (`LayerCacheKind.kv_window`),
        else None (a full-attention or chunked part reads from position 0, or there is no
        attention part at all)."""
        windows = [part.kv_window for part in self.attention_parts]
        if not windows or None in windows:
            return None
        return max(window for window in windows if window is not None)


def prefix_caching_with(kinds: Iterable[CacheKind]) -> bool:
    """Whether a model whose layers keep `kinds` can share cached prefix blocks between
    sequences: not when a part keeps a recurrent state, which summarizes the whole prefix
    in one slot that no block boundary can hand to another sequence."""
    return all(kind.can_rewind for kind in kinds)


def speculative_decoding_with(kinds: Iterable[CacheKind]) -> bool:
    """Whether a model whose layers keep `kinds` can roll rejected draft tokens back: not
    through a recurrent state, which has absorbed them."""
    return all(kind.can_rewind for kind in kinds)


def pipeline_stages_with(kinds: Iterable[CacheKind]) -> bool:
    """Whether a model whose layers keep `kinds` can be split into pipeline stages: the
    stages hold attention layers only (their paged KV), no state slots."""
    return all(kind.stores_kv for kind in kinds)


@runtime_checkable
class CacheLayoutModel(Protocol):
    """A model that says what each of its layers keeps (`CacheLayout`); a model without
    it is taken to be all full attention."""

    @property
    def cache_layout(self) -> CacheLayout: ...


class _CacheMaker(Protocol):
    def make_cache(self) -> Sequence[object]: ...


def model_cache_layout(model: _CacheMaker) -> CacheLayout:
    """The model's own layout (`CacheLayoutModel`), else one full-attention layer per
    cache its `make_cache` makes."""
    if isinstance(model, CacheLayoutModel):
        return model.cache_layout
    return CacheLayout.all_attention(len(model.make_cache()))


def joint_kv_window(layouts: Sequence[CacheLayout]) -> int | None:
    """The window (`CacheLayout.kv_window`) every model sharing one set of block tables
    allows (a target model and its draft): the largest, or None if any model reads
    every position or has no attention part."""
    windows = [layout.kv_window for layout in layouts]
    if any(window is None for window in windows):
        return None
    return max(window for window in windows if window is not None)
