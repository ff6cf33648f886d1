"""What an engine is built from: the model's profile, the KV cache sized from it, the
scheduler, the model runner and speculative decoding's drafter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.paged import KVCacheManager, PagedKVStorage
from mlxcel_core.engine.config import EngineConfig, make_kv_storage, plan_kv_blocks
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.engine.remote_prefill import PrefilledKV, RemotePrefill, RemotePrefillFactory
from mlxcel_core.engine.runner import ModelRunner
from mlxcel_core.engine.scheduler import Scheduler
from mlxcel_core.engine.speculation import Speculation, make_speculation
from mlxcel_core.generate import LanguageModel

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
        kv: the KV cache manager (block tables, prefix cache).
        storages: the KV pools: the model's, then the draft model's if it has one.
        scheduler: the token-budget scheduler over `kv`.
        runner: runs the model's forward passes over `storages[0]`.
        speculation: the drafter and its settings, or None without speculative decoding.
        remote_prefill: where new prompts are prefilled, or None to prefill here.
    """

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
    """Profile the model (and the draft model), size the KV cache, and build the rest;
    `deliver` is the callback `make_remote_prefill` hands arriving KV to.

    Raises:
        InsufficientMemoryError: the KV budget cannot hold one sequence of `context_size`.
        ValueError: the model stores no keys and values, the draft model has another
            vocabulary size, or `make_remote_prefill` comes without `deliver`.
    """
    if make_remote_prefill is not None and deliver is None:
        raise ValueError("deliver must be given with make_remote_prefill")
    chunk = config.scheduler.max_prefill_chunk
    profile = profile_model(model, chunk)
    draft_profile = None
    if draft_model is not None:
        draft_profile = profile_model(draft_model, chunk)
        if draft_profile.vocab_size != profile.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft_profile.vocab_size} tokens) is not "
                f"the model's ({profile.vocab_size}); a draft model must share it"
            )
    num_blocks = plan_kv_blocks(config, profile, draft_profile)
    kv = KVCacheManager(
        num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
    )
    storage = make_kv_storage(config, profile, num_blocks)
    storages = [storage]
    speculation = None
    if config.speculative is not None:
        draft = None
        if draft_model is not None and draft_profile is not None:
            draft = (draft_model, draft_profile)
        speculation, draft_storage = make_speculation(
            config.speculative, draft, block_size=config.block_size, num_blocks=num_blocks
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
    )
    runner = (make_runner or _make_model_runner)(model, storage, adapters)
    remote_prefill = None
    if make_remote_prefill is not None:
        remote_prefill = make_remote_prefill(storage, deliver)
    return EngineParts(kv, tuple(storages), scheduler, runner, speculation, remote_prefill)
