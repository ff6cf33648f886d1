"""The engine's KV cache as planned: its block groups, each group's blocks, and the KV
manager and pools built from them."""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel_core.cache.block_groups import BlockGroups
from mlxcel_core.cache.layout import CacheLayout
from mlxcel_core.cache.paged import KVCacheManager, PagedKVStorage, WindowGroup
from mlxcel_core.engine.config import EngineConfig, make_kv_storage, plan_group_blocks
from mlxcel_core.engine.memory import ModelProfile


@dataclass(frozen=True)
class KVCachePlan:
    """What the engine's KV cache holds.

    Attributes:
        groups: the block groups (`BlockGroups`), widest first.
        num_blocks: each group's blocks, its null block included.
        layer_groups: each of the model's attention layers' group.
        draft_layer_groups: each of the draft model's attention layers' group (empty
            without a draft model).

    Raises:
        ValueError: `num_blocks` does not hold one count per group.
    """

    groups: BlockGroups
    num_blocks: tuple[int, ...]
    layer_groups: tuple[int, ...]
    draft_layer_groups: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.num_blocks) != self.groups.num_groups:
            raise ValueError(
                f"num_blocks must hold {self.groups.num_groups} counts, got {self.num_blocks}"
            )


def plan_kv_cache(
    config: EngineConfig,
    profile: ModelProfile,
    layout: CacheLayout,
    draft: tuple[ModelProfile, CacheLayout] | None = None,
    *,
    separate_windows: bool = True,
) -> KVCachePlan:
    """The block groups of a model (and its draft model, which shares its block tables)
    and the blocks memory allows each (`plan_group_blocks`).

    Args:
        config: the engine's settings.
        profile: the model's profile.
        layout: the model's cache layout.
        draft: the draft model's profile and layout, with a draft model.
        separate_windows: a block group per window (`BlockGroups.of`); False keeps one
            group for every layer.

    Raises:
        InsufficientMemoryError: a group cannot hold one sequence of the context size.
    """
    layouts = [layout] if draft is None else [layout, draft[1]]
    groups = BlockGroups.of(layouts, separate_windows=separate_windows)
    layer_groups = groups.layer_groups(layout)
    draft_layer_groups = () if draft is None else groups.layer_groups(draft[1])
    num_blocks = plan_group_blocks(
        config,
        profile,
        None if draft is None else draft[0],
        windows=groups.windows,
        layer_groups=layer_groups,
        draft_layer_groups=draft_layer_groups,
    )
    return KVCachePlan(groups, num_blocks, layer_groups, draft_layer_groups)


def make_kv_manager(
    plan: KVCachePlan, block_size: int, *, prefix_caching: bool, min_cached_tokens: int = 0
) -> KVCacheManager:
    """The KV manager of the plan's groups: the first with its window as the manager's
    `sliding_window`, the others as its `window_groups`; `min_cached_tokens` as
    `KVCacheManager` takes it."""
    groups = plan.groups
    return KVCacheManager(
        plan.num_blocks[0],
        block_size,
        enable_prefix_caching=prefix_caching,
        min_cached_tokens=min_cached_tokens,
        sliding_window=groups.windows[0],
        window_groups=[
            WindowGroup(window, count)
            for window, count in zip(groups.narrower_windows, plan.num_blocks[1:], strict=True)
        ],
    )


def make_planned_storage(
    config: EngineConfig, profile: ModelProfile, plan: KVCachePlan
) -> PagedKVStorage:
    """The model's KV pools as `plan` groups them (`make_kv_storage`)."""
    return make_kv_storage(
        config,
        profile,
        plan.num_blocks,
        windows=plan.groups.windows,
        layer_groups=plan.layer_groups,
    )
