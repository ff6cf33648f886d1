"""The memory check `generate` and `serve` run before loading a model (docs/memory.md).

From the model's headers alone it estimates the resident weights, the KV cache of one
sequence of the context size, the largest step's activations, and what the engine sets
aside for each sequence it decodes at once (the residual window's exact copies beside a
quantized cache type, a recurrent model's states), and refuses to start when they do not
fit in the memory the device can give (`--no-memory-check` starts anyway);
`--estimate-memory` prints the estimate on stderr.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TextIO

import mlx.core as mx

from mlxcel.common.flags import Flag, RunError, UsageError, flag_error
from mlxcel_core.cache.quant import AUTO, CacheTypeError
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.default_model import default_model_path
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.memory import (
    ContextRequest,
    MemoryBudget,
    MemoryEstimate,
    device_memory_budget,
    estimate_memory,
    read_model_inventory,
)
from mlxcel_models.store import resolve_model

MEMORY_FLAGS = (
    Flag(("--estimate-memory",), "estimate_memory", bool, False,
         "print the memory estimate (weights, KV cache, activations) on stderr before loading",
         is_switch=True),
    Flag(("--no-memory-check",), "no_memory_check", bool, False,
         "start even when the model and one sequence of -c tokens do not fit in memory",
         is_switch=True),
)  # fmt: skip


def format_bytes(num_bytes: int) -> str:
    """`num_bytes` in binary units with one decimal ("513.1 MiB")."""
    if num_bytes < 1024:
        return f"{num_bytes} B"
    value = num_bytes / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def context_request_from(args: argparse.Namespace) -> ContextRequest:
    """The estimate's settings from resolved engine flags.

    Raises:
        UsageError: a value is out of range, or a cache type is unknown.
    """
    # -b is checked on its own: the estimate sees only the smaller of -b and -ub.
    if args.batch_size < 1:
        raise UsageError(f"-b/--batch-size must be >= 1, got {args.batch_size}")
    try:
        return ContextRequest(
            context_size=args.ctx_size,
            chunk_tokens=min(args.ubatch_size, args.batch_size),
            block_size=args.block_size,
            cache_type_k=args.cache_type_k,
            cache_type_v=args.cache_type_v,
            cache_residual=args.cache_residual,
        )
    except ValueError as error:
        raise flag_error(str(error), _FLAG_NAMES) from error


_FLAG_NAMES = {
    "context_size": "-c/--ctx-size",
    "chunk_tokens": "-ub/--ubatch-size",
    "block_size": "--block-size",
    "cache_type_k": "-ctk/--cache-type-k",
    "cache_type_v": "-ctv/--cache-type-v",
    "cache_residual": "--cache-residual",
}


def estimate_for_start(
    args: argparse.Namespace, options: ComputeOptions, *, running_sequences: int
) -> MemoryEstimate:
    """What the model `-m` (and the draft model `-md`, if any) will take with one sequence
    of `-c` tokens and `running_sequences` decoded at once (`estimate_memory`), loaded with
    `options`, from their headers. A Hugging Face id is resolved through
    `args.model_store` first, downloaded if the store does not hold it yet.

    Raises:
        ModelLoadError: a model is missing, corrupt or unsupported, its config is
            invalid, or an id cannot be fetched.
        UsageError: a KV cache type cannot store the model's head dim.
    """
    request = context_request_from(args)
    if args.model is None:
        path = default_model_path()
    else:
        path = resolve_model(args.model, args.model_store, revision=args.revision)
    try:
        estimate = estimate_memory(
            read_model_inventory(path), request, options, running_sequences=running_sequences
        )
        if args.model_draft is not None:
            # The draft's KV is kept in its own dtype, whatever -ctk/-ctv say, so it keeps
            # no residual window.
            draft_request = replace(request, cache_type_k=AUTO, cache_type_v=AUTO, cache_residual=0)
            draft_path = resolve_model(args.model_draft, args.model_store)
            draft_options = ComputeOptions.for_device(mx.default_device())
            draft = estimate_memory(
                read_model_inventory(draft_path),
                draft_request,
                draft_options,
                running_sequences=running_sequences,
            )
            estimate = estimate.beside(draft)
    except CacheTypeError as error:
        raise flag_error(str(error), _FLAG_NAMES) from error
    # Anything else the lazily built model refuses is the model's (its config's) fault.
    except ValueError as error:
        raise ModelLoadError(f"{path}: {error}") from error
    return estimate


def breakdown(estimate: MemoryEstimate) -> str:
    """The estimate as "X (weights A + KV B + activations C)", with "+ residual window R"
    after the KV cache when a residual window keeps exact copies beside a quantized cache,
    and "+ states D" for a model with recurrent layers."""
    residual = f" + residual window {format_bytes(estimate.residual)}" if estimate.residual else ""
    states = f" + states {format_bytes(estimate.states)}" if estimate.states else ""
    return (
        f"{format_bytes(estimate.total)} (weights {format_bytes(estimate.weights)} + "
        f"KV {format_bytes(estimate.kv_cache)}{residual} + "
        f"activations {format_bytes(estimate.activations)}{states})"
    )


def describe_budget(budget: MemoryBudget) -> str:
    """The budget as "Y usable (90% of Z, W available now)"."""
    return (
        f"{format_bytes(budget.usable_bytes)} usable ({budget.utilization:.0%} of "
        f"{format_bytes(budget.device_bytes)}, {format_bytes(budget.available_bytes)} "
        "available now)"
    )


def check_memory(
    args: argparse.Namespace,
    err: TextIO,
    options: ComputeOptions,
    *,
    running_sequences: int,
    budget: MemoryBudget | None = None,
) -> None:
    """Refuse to start when the model and one sequence of `-c` tokens do not fit, with
    what the engine sets aside for `running_sequences` decoded at once.

    Args:
        args: resolved `generate` / `serve` flags, `args.model_store` set.
        err: where `--estimate-memory` prints the estimate.
        options: the compute options the model will be loaded with.
        running_sequences: the engine's sequences at once (`max_num_seqs`): each has a
            residual window's exact copies and a recurrent model's states set aside.
        budget: the memory to check against; None asks the device
            (`device_memory_budget` with `--gpu-memory-utilization`).

    Raises:
        RunError: it does not fit and `--no-memory-check` is not given.
        ModelLoadError: a model is missing, corrupt or unsupported.
        UsageError: a flag's value cannot be used for the estimate.
    """
    if args.no_memory_check and not args.estimate_memory:
        return
    estimate = estimate_for_start(args, options, running_sequences=running_sequences)
    if budget is None:
        budget = device_memory_budget(args.memory_utilization)
    if args.estimate_memory:
        message = f"needs {breakdown(estimate)}; {describe_budget(budget)}"
        print(f"mlxcel: memory: {message}", file=err, flush=True)
    if estimate.total > budget.usable_bytes and not args.no_memory_check:
        what = "the model and one sequence of the context size"
        remedies = ["lower -c/--ctx-size", "store the KV cache in a smaller type (-ctk/-ctv)"]
        if estimate.residual:
            remedies.append("lower --cache-residual")
        if running_sequences > 1 and (estimate.residual or estimate.states):
            what += f", with what {running_sequences} sequences at once set aside,"
            remedies.append("lower -np/--parallel")
        raise RunError(
            f"{what} need {breakdown(estimate)} but {format_bytes(budget.usable_bytes)} is "
            f"available; {', '.join(remedies)}, or pass --no-memory-check"
        )
