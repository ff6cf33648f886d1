"""What an engine is built from: the model's profile, the KV cache planned from it (block
groups, state slots), the scheduler, the model runner and speculative decoding's drafter."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.layout import model_cache_layout
from mlxcel_core.cache.paged import KVCacheManager, PagedKVStorage
from mlxcel_core.engine.config import (
    EngineConfig,
    check_cache_layout,
    prefill_chunk_for,
    profile_largest_step,
)
from mlxcel_core.engine.kv_plan import make_kv_manager, make_planned_storage, plan_kv_cache
from mlxcel_core.engine.remote_prefill import PrefilledKV, RemotePrefill, RemotePrefillFactory
from mlxcel_core.engine.runner import ModelRunner
from mlxcel_core.engine.scheduler import Scheduler
from mlxcel_core.engine.speculation import Speculation, make_speculation
from mlxcel_core.language_model import LanguageModel

logger = logging.getLogger(__name__)

# Builds the engine's model runner from the model, its KV storage and unfused adapters.
RunnerFactory = Callable[[LanguageModel, PagedKVStorage, RowAdapterScales | None], ModelRunner]


def _make_model_runner(
    model: LanguageModel, storage: PagedKVStorage, adapters: RowAdapterScales | None
) -> ModelRunner:
    return ModelRunner(model, storage, adapters=adapters)


@dataclass(frozen=True)
class EngineParts:
    """An engine's pieces.

    Attributes:
        config: the engine's settings as it runs them: the config given, with its prefill
            chunk lowered to what `max_prefill_seconds` allows (`prefill_chunk_for`).
        kv: the KV cache manager (block tables per block group, prefix cache).
        storages: the KV pools: the model's, then the draft model's if it has one.
        scheduler: the token-budget scheduler over `kv`.
        runner: runs the model's forward passes over `storages[0]`.
        speculation: the drafter and its settings, or None without speculative decoding.
        remote_prefill: where new prompts are prefilled, or None to prefill here.
    """

    config: EngineConfig
    kv: KVCacheManager
    storages: tuple[PagedKVStorage, ...]
    scheduler: Scheduler
    runner: ModelRunner
    speculation: Speculation | None
    remote_prefill: RemotePrefill | None


def make_engine_parts(
    model: LanguageModel,
    config: EngineConfig,
    *,
    draft_model: LanguageModel | None,
    adapters: RowAdapterScales | None,
    make_runner: RunnerFactory | None,
    make_remote_prefill: RemotePrefillFactory | None,
    deliver: Callable[[PrefilledKV], None] | None,
) -> EngineParts:
    """Profile the model (and the draft model) over the largest step `config` runs
    (`profile_largest_step`), lower the prefill chunk to the time limit at the measured
    speed, plan and size the KV cache, and build the rest; `deliver` is the callback
    `make_remote_prefill` hands arriving KV to.

    A model with recurrent state layers gets a state slot per running sequence and no
    prefix caching; sliding-window layers get block groups of their own, except with
    disaggregated prefill, which hands over one block table per sequence (`plan_kv_cache`).

    Raises:
        InsufficientMemoryError: the KV budget cannot hold one sequence of `context_size`.
        ValueError: the model stores no keys and values, the draft model has another
            vocabulary size, `make_remote_prefill` comes without `deliver`, or speculative
            decoding or disaggregated prefill is asked of a model with recurrent state
            layers (`check_cache_layout`).
    """
    if make_remote_prefill is not None and deliver is None:
        raise ValueError("deliver must be given with make_remote_prefill")
    layout = model_cache_layout(model)
    check_cache_layout(layout, config, remote_prefill=make_remote_prefill is not None)
    profile = profile_largest_step(config, model, layout)
    draft_profile = draft_cache = None
    if draft_model is not None:
        draft_layout = model_cache_layout(draft_model)
        draft_profile = profile_largest_step(config, draft_model, draft_layout)
        draft_cache = (draft_profile, draft_layout)
        if draft_profile.vocab_size != profile.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft_profile.vocab_size} tokens) is not "
                f"the model's ({profile.vocab_size}); a draft model must share it"
            )
    if config.enable_prefix_caching and not layout.supports_prefix_caching:
        logger.info(
            "prefix caching is off: the model's recurrent layers keep a state per "
            "sequence that no cached block can share"
        )
    chunk = prefill_chunk_for(config, profile)
    if chunk != config.scheduler.max_prefill_chunk:
        config = replace(config, scheduler=replace(config.scheduler, max_prefill_chunk=chunk))
    plan = plan_kv_cache(
        config, profile, layout, draft_cache, separate_windows=make_remote_prefill is None
    )
    # With a residual window, a prompt computed afresh reads its first prefill chunk's
    # positions exactly, and one continuing a cached prefix reads that prefix as stored: a
    # short prompt after a cached chat template could answer otherwise than afresh (q4_0,
    # turbo). So a cached prefix is used only from one chunk on, where a fresh prompt too
    # reads its earlier chunks as stored (docs/kv-cache.md).
    kv = make_kv_manager(
        plan,
        config.block_size,
        prefix_caching=config.enable_prefix_caching and layout.supports_prefix_caching,
        min_cached_tokens=config.scheduler.max_prefill_chunk if config.cache_residual else 0,
    )
    storage = make_planned_storage(config, profile, plan)
    storages = [storage]
    speculation = None
    if config.speculative is not None:
        draft = None
        if draft_model is not None and draft_profile is not None:
            draft = (draft_model, draft_profile)
        speculation, draft_storage = make_speculation(
            config.speculative, draft, block_size=config.block_size, plan=plan
        )
        if draft_storage is not None:
            storages.append(draft_storage)
    scheduler = Scheduler(
        config.scheduler,
        kv,
        num_lookahead_tokens=(
            0 if config.speculative is None else config.speculative.num_draft_tokens
        ),
        remote_prefill=make_remote_prefill is not None,
        recurrent_state=layout.has_state,
    )
    runner = (make_runner or _make_model_runner)(model, storage, adapters)
    remote_prefill = None
    if make_remote_prefill is not None:
        remote_prefill = make_remote_prefill(storage, deliver)
    return EngineParts(config, kv, tuple(storages), scheduler, runner, speculation, remote_prefill)
