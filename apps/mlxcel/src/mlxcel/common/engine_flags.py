"""The continuous-batching engine's flags, shared by `serve` and batch `generate`.

`-np`, `-ub`, `-ctk` and `-ctv` are llama-server's; `--block-size` and
`--gpu-memory-utilization` are vLLM's (as is the cache type name `auto`); the speculative
decoding flags are in `speculative_flags`.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TextIO

import mlx.core as mx

from mlxcel.common.flags import Flag, RunError, UsageError, flag_error
from mlxcel.common.loading import describe_weights
from mlxcel.common.speculative_flags import (
    SPECULATIVE_FLAGS,
    load_draft_model,
    speculative_config_from,
)
from mlxcel_core.cache.layout import model_cache_layout
from mlxcel_core.cache.quant import AUTO, CACHE_TYPES
from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    InsufficientMemoryError,
    RunnerFactory,
    SchedulerConfig,
)
from mlxcel_models.loaded import LoadedModel

UBATCH_SIZE_FLAG = Flag(
    ("-ub", "--ubatch-size"),
    "ubatch_size",
    int,
    512,
    "most prompt tokens of one request per forward pass (prefill chunk; on the CPU fewer "
    "if one would take over a second at the speed measured at start-up; with "
    "MLXCEL_AUTOTUNE set and neither this flag nor its variable given, the tuned one)",
    env="LLAMA_ARG_UBATCH",
)
_CACHE_TYPE_HELP = f"({', '.join(CACHE_TYPES)}); auto = the model's own dtype"
# On the CPU a prefill chunk is cut to what the speed measured at start-up prefills in about
# a second, so a request cancelled during a long prompt frees its slot within that time
# (a 512-token chunk takes tens of seconds on MLX's reference BLAS).
CPU_PREFILL_CHUNK_SECONDS = 1.0

ENGINE_FLAGS = (
    Flag(("-np", "--parallel"), "parallel", int, 4,
         "sequences generated at once (continuous batching); more wait in a queue",
         env="LLAMA_ARG_N_PARALLEL"),
    UBATCH_SIZE_FLAG,
    Flag(("--block-size",), "block_size", int, 16, "tokens per KV cache block"),
    Flag(("--kv-cache-blocks",), "kv_cache_blocks", int, 0,
         "KV cache blocks to use; 0 = as many as --gpu-memory-utilization allows"),
    Flag(("--gpu-memory-utilization",), "memory_utilization", float, 0.9,
         "fraction of device memory (RAM on a CPU) for weights, activations and KV cache"),
    Flag(("-ctk", "--cache-type-k"), "cache_type_k", str, "auto",
         f"KV cache type for keys {_CACHE_TYPE_HELP}", env="LLAMA_ARG_CACHE_TYPE_K"),
    Flag(("-ctv", "--cache-type-v"), "cache_type_v", str, "auto",
         f"KV cache type for values {_CACHE_TYPE_HELP}", env="LLAMA_ARG_CACHE_TYPE_V"),
    Flag(("--cache-residual",), "cache_residual", int, None,
         "positions at the end of each sequence whose quantized keys/values are also kept "
         "exact, float16 for a float32 model (a KIVI-style residual window; decode then "
         "reads through the gather path); 0 = none; default 16 beside a quantized type, "
         "0 where turbo keys and values decode through the GPU kernels"),
    *SPECULATIVE_FLAGS,
)  # fmt: skip


def open_engine(
    args: argparse.Namespace,
    loaded: LoadedModel,
    config: EngineConfig,
    *,
    context_size: int,
    err: TextIO,
    make_runner: RunnerFactory | None = None,
) -> Engine:
    """Start an engine on `loaded` (with its unfused adapters) with `config` (from
    `engine_config_from`) and `context_size`, loading the draft model `-md` names;
    `make_runner` builds its model runner (`--tp`/`--pp`'s lockstep runner), None the plain one.
    A context beyond the model's trained one is warned of on `err`.

    Raises:
        UsageError: -ctk/-ctv are given for a model without a KV cache, the draft model
            keeps recurrent state or its vocabulary differs, or a KV cache type cannot
            store the model's head dim.
        ModelLoadError: the draft model cannot be loaded.
        RunError: the KV cache cannot hold one sequence of the context size.
    """
    check_cache_types_fit(args, loaded)
    warn_beyond_trained_context(context_size, loaded.config.context_length, err)
    config = replace(config, context_size=context_size)
    draft = load_draft_model(args, loaded)
    draft_model = None if draft is None else draft.model
    try:
        return Engine(
            loaded.model,
            config,
            draft_model=draft_model,
            adapters=loaded.row_adapters,
            make_runner=make_runner,
        )
    except InsufficientMemoryError as error:
        raise RunError(str(flag_error(str(error), _FLAG_NAMES))) from error
    except ValueError as error:
        raise UsageError(str(error)) from error


def engine_config_from(args: argparse.Namespace, *, max_waiting: int) -> EngineConfig:
    """The engine's limits from resolved flags (the context size is set once the model loads).

    Raises:
        UsageError: a value is out of range, or the speculative decoding flags conflict.
    """
    if args.kv_cache_blocks < 0 or args.kv_cache_blocks == 1:
        raise UsageError(
            f"--kv-cache-blocks must be 0 (as memory allows) or >= 2, got {args.kv_cache_blocks}"
        )
    try:
        return EngineConfig(
            scheduler=SchedulerConfig(
                max_num_seqs=args.parallel,
                max_num_batched_tokens=args.batch_size,
                max_prefill_chunk=min(args.ubatch_size, args.batch_size),
            ),
            block_size=args.block_size,
            num_kv_blocks=args.kv_cache_blocks or None,
            memory_utilization=args.memory_utilization,
            max_waiting=max_waiting,
            speculative=speculative_config_from(args),
            cache_type_k=args.cache_type_k,
            cache_type_v=args.cache_type_v,
            cache_residual=args.cache_residual,
            max_prefill_seconds=(
                CPU_PREFILL_CHUNK_SECONDS if mx.default_device().type == mx.DeviceType.cpu else None
            ),
        )
    except ValueError as error:
        raise flag_error(str(error), _FLAG_NAMES) from error


_FLAG_NAMES = {
    "max_num_seqs": "-np/--parallel",
    "max_num_batched_tokens": "-b/--batch-size",
    "max_prefill_chunk": "-ub/--ubatch-size",
    "block_size": "--block-size",
    "num_kv_blocks": "--kv-cache-blocks",
    "memory_utilization": "--gpu-memory-utilization",
    "max_waiting": "--max-queue",
    "cache_type_k": "-ctk/--cache-type-k",
    "cache_type_v": "-ctv/--cache-type-v",
    "cache_residual": "--cache-residual",
}


def describe_kv_cache(loaded: LoadedModel, config: EngineConfig) -> str | None:
    """The KV cache types and residual window `config` runs `loaded` with, for the lines on
    stderr ("KV cache: K q8_0, V q8_0, residual window 16"): the window kept, at most
    `config`'s context size (`EngineConfig.residual_window`), whose default differs by
    device (`default_residual_window`). None for a model whose layers keep no keys and
    values."""
    if not model_cache_layout(loaded.model).attention_parts:
        return None
    return (
        f"KV cache: K {config.cache_type_k}, V {config.cache_type_v}, "
        f"residual window {config.residual_window}"
    )


def print_setup(loaded: LoadedModel, config: EngineConfig, err: TextIO) -> None:
    """How the weights are held, then the KV cache types and residual window
    (`describe_kv_cache`), on `err`: `generate`'s last lines."""
    print(describe_weights(loaded), file=err)
    kv_cache = describe_kv_cache(loaded, config)
    if kv_cache is not None:
        print(kv_cache, file=err)


def check_cache_types_fit(args: argparse.Namespace, loaded: LoadedModel) -> None:
    """Refuse -ctk/-ctv for a model whose layers keep no keys and values.

    Raises:
        UsageError: a cache type other than `auto` is given and the model keeps only
            recurrent state.
    """
    if model_cache_layout(loaded.model).attention_parts:
        return
    given = [
        name
        for name, value in (
            ("-ctk/--cache-type-k", args.cache_type_k),
            ("-ctv/--cache-type-v", args.cache_type_v),
        )
        if value != AUTO
    ]
    if given:
        raise UsageError(
            f"{' and '.join(given)}: {loaded.source.path.name} ({loaded.source.model_type}) "
            "keeps no KV cache, only recurrent state: there are no keys or values to store"
        )


def trained_context_warning(context_size: int, trained: int) -> str | None:
    """The warning for a context longer than the one the model was trained for (as
    llama-server's "possible training context overflow"); None within it."""
    if context_size <= trained:
        return None
    return (
        f"warning: -c/--ctx-size {context_size} is above the model's trained context "
        f"({trained} tokens): possible training context overflow, output past "
        f"{trained} tokens may degrade"
    )


def warn_beyond_trained_context(context_size: int, trained: int, err: TextIO) -> None:
    """Print `trained_context_warning` on `err`, if any."""
    warning = trained_context_warning(context_size, trained)
    if warning is not None:
        print(f"mlxcel: {warning}", file=err)
