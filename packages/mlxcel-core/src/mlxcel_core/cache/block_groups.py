"""Block groups: which attention layers share a block table.

Layers that read every earlier position need a sequence's every block; a sliding-window
layer of W positions needs only the blocks its window reaches. Giving each window its own
block group (its own pool and block tables) lets the windowed layers free the blocks
behind their window while the full-attention layers keep theirs, so a model that mixes
the two (Gemma 2/3, Cohere 2, gpt-oss) holds about W positions per windowed layer
instead of the whole context. This is vLLM's hybrid KV cache manager
(`vllm/v1/core/kv_cache_coordinator.py`), with a pool per group.

Groups are ordered widest first: full attention (window None), then windows from the
largest down. Group 0, the widest, is the one a fixed block count (`--kv-cache-blocks`)
sizes. A layer goes to the narrowest group whose window covers its own: its own window's
group when there is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.cache.layout import CacheLayout, LayerCacheKind, joint_kv_window


def _widest_first(window: int | None) -> tuple[bool, int]:
    return (window is not None, -(window or 0))


@dataclass(frozen=True)
class BlockGroups:
    """The windows of a set of block groups, widest first.

    Attributes:
        windows: each group's window (positions its layers read back, their own
            included); None for full attention. No two alike.

    Raises:
        ValueError: `windows` is empty, holds a window < 1 or a repeat, or is not widest
            first.
    """

    windows: tuple[int | None, ...] = (None,)

    def __post_init__(self) -> None:
        if not self.windows:
            raise ValueError("block groups need at least one group")
        if any(window is not None and window < 1 for window in self.windows):
            raise ValueError(f"every window must be None or >= 1, got {self.windows}")
        if len(set(self.windows)) != len(self.windows):
            raise ValueError(f"each group needs its own window, got {self.windows}")
        if list(self.windows) != sorted(self.windows, key=_widest_first):
            raise ValueError(f"groups must be ordered widest first, got {self.windows}")

    @classmethod
    def of(cls, layouts: Sequence[CacheLayout], *, separate_windows: bool = True) -> BlockGroups:
        """The groups of models that share block tables (a model and its draft model).

        Args:
            layouts: each model's cache layout.
            separate_windows: a group per window found among the models' attention parts;
                False gives one group for all of them, windowed by `joint_kv_window`
                (blocks behind a window freed only when every part is windowed).
        """
        if not separate_windows:
            return cls((joint_kv_window(layouts),))
        windows = {part.kv_window for layout in layouts for part in layout.attention_parts} or {
            None
        }
        return cls(tuple(sorted(windows, key=_widest_first)))

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def narrower_windows(self) -> tuple[int, ...]:
        """The windows of the groups after the first (never full attention, which only
        the widest group can be)."""
        return tuple(window for window in self.windows[1:] if window is not None)

    def group_of(self, part: LayerCacheKind) -> int:
        """The group an attention part's keys and values live in: the narrowest whose
        window covers the part's (`LayerCacheKind.kv_window`: a chunked part, like a
        full-attention one, lives in the full-attention group).

        Raises:
            ValueError: the part keeps no keys and values, or no group covers it.
        """
        if not part.stores_kv:
            raise ValueError("a state part keeps no keys and values in a block group")
        wanted = part.kv_window
        covering = [
            group
            for group, window in enumerate(self.windows)
            if window is None or (wanted is not None and window >= wanted)
        ]
        if not covering:
            raise ValueError(f"no block group of windows {self.windows} covers {part}")
        return covering[-1]

    def layer_groups(self, layout: CacheLayout) -> tuple[int, ...]:
        """Each attention part's group, in the paged storage's layer order."""
        return tuple(self.group_of(part) for part in layout.attention_parts)
