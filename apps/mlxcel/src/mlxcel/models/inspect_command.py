"""`mlxcel inspect`: a model's size, its KV cache per token for every cache type, and
whether it fits in memory with the requested context, from its headers alone.

-c is the context of each sequence and -np how many run at once, as for `serve`: each
sequence may grow to -c tokens (docs/memory.md).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import mlx.core as mx

from mlxcel.common.engine_flags import ENGINE_FLAGS, trained_context_warning
from mlxcel.common.flags import (
    BATCH_SIZE_FLAG,
    CTX_SIZE_FLAG,
    MODEL_FLAG,
    Flag,
    UsageError,
    add_command,
    resolve_defaults,
)
from mlxcel.common.loading import compute_options
from mlxcel.common.memory_preflight import (
    breakdown,
    context_request_from,
    describe_budget,
    format_bytes,
)
from mlxcel.models.store_flags import STORE_FLAGS, resolve_store_flags
from mlxcel_core.cache.quant import AUTO, CACHE_TYPES, CacheTypeError
from mlxcel_models.default_model import default_model_path
from mlxcel_models.memory import (
    MemoryBudget,
    MemoryEstimate,
    activation_dtype,
    cache_geometry,
    device_memory_budget,
    estimate_memory,
    estimate_weights,
    kv_bytes_per_token,
    read_model_inventory,
    sequences_kv_bytes,
)
from mlxcel_models.memory.cache_geometry import ModelCacheGeometry
from mlxcel_models.store import resolve_model

_ESTIMATE_FLAGS = {
    "parallel", "ubatch_size", "block_size", "memory_utilization", "cache_type_k", "cache_type_v",
    "cache_residual",
}  # fmt: skip
FLAGS = (
    MODEL_FLAG,
    *STORE_FLAGS,
    CTX_SIZE_FLAG,
    BATCH_SIZE_FLAG,
    *(flag for flag in ENGINE_FLAGS if flag.dest in _ESTIMATE_FLAGS),
    Flag(("--json",), "json", bool, False, "print one JSON object instead of text",
         env="MLXCEL_JSON", is_switch=True),
)  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "inspect", __doc__, FLAGS, run)


@dataclass(frozen=True)
class Verdict:
    """Whether the model fits.

    Attributes:
        fits: "all" (-np sequences of -c tokens), "one" (one sequence of -c tokens only:
            the engine then runs fewer at once) or "none".
        margin_bytes: usable memory left over with what fits ("all": -np sequences; else
            one), negative when even one does not fit.
    """

    fits: str
    margin_bytes: int


def _verdict(
    estimate: MemoryEstimate, all_sequences: MemoryEstimate, budget: MemoryBudget
) -> Verdict:
    usable = budget.usable_bytes
    if all_sequences.total <= usable:
        return Verdict("all", usable - all_sequences.total)
    return Verdict("one" if estimate.total <= usable else "none", usable - estimate.total)


def _kv_table(
    geometry: ModelCacheGeometry, tokens: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Bytes per token, per sequence and for -np sequences, for every cache type; no rows
    for a model whose layers keep no keys and values."""
    if not geometry.layers:
        return []
    request = context_request_from(args)
    rows: list[dict[str, Any]] = []
    for cache_type in CACHE_TYPES:
        types = {"cache_type_k": cache_type, "cache_type_v": cache_type}
        try:
            per_token = kv_bytes_per_token(geometry.layers, cache_type, cache_type)
        except CacheTypeError as error:
            rows.append({"type": cache_type, "error": str(error)})
            continue
        rows.append(
            {
                "type": cache_type,
                "bytes_per_token": per_token,
                "context_bytes": sequences_kv_bytes(geometry, request, tokens, **types),
                "parallel_bytes": sequences_kv_bytes(
                    geometry, request, tokens, **types, num_sequences=args.parallel
                ),
            }
        )
    return rows


def _windowed_layers(geometry: ModelCacheGeometry) -> dict[int, int]:
    """Attention layers per window, for the layers that read a window only."""
    counts = Counter(
        part.window_size for part in geometry.layout.attention_parts if part.window_size
    )
    return dict(sorted(counts.items()))


def inspect_model(args: argparse.Namespace, budget: MemoryBudget) -> dict[str, Any]:
    """Everything `inspect` reports, as plain data (its `--json` output). A Hugging Face
    id is resolved through `args.model_store` (downloaded if the store lacks it).

    Raises:
        ModelLoadError: the model is missing, corrupt or unsupported, or an id cannot be
            fetched.
        UsageError: a flag is out of range, or -ctk/-ctv cannot store the model's head dim.
    """
    if args.parallel < 1:
        raise UsageError(f"-np/--parallel must be >= 1, got {args.parallel}")
    request = context_request_from(args)
    if args.model is None:
        path = default_model_path()
    else:
        path = resolve_model(args.model, args.model_store, revision=args.revision)
    inventory = read_model_inventory(path)
    options = compute_options(args.parallel)
    tokens = request.tokens(inventory)
    geometry = cache_geometry(inventory, options)
    has_kv = bool(geometry.layers)
    if not has_kv and (request.cache_type_k, request.cache_type_v) != (AUTO, AUTO):
        raise UsageError(
            f"-ctk/-ctv: {inventory.source.path.name} ({inventory.source.model_type}) keeps "
            "no KV cache, only recurrent state: there are no keys or values to store"
        )
    try:
        # What the check before loading tests for `serve -np`: one sequence's KV blocks,
        # and what the engine sets aside for each of -np sequences.
        estimate = estimate_memory(inventory, request, options, running_sequences=args.parallel)
        all_sequences = estimate_memory(
            inventory,
            request,
            options,
            running_sequences=args.parallel,
            full_contexts=args.parallel,
        )
    except CacheTypeError as error:
        raise UsageError(str(error)) from error
    weights = estimate_weights(inventory, options)
    arch = inventory.architecture
    warning = trained_context_warning(tokens, arch.context_length)
    stored = Counter[str]()
    for tensor in inventory.tensors:
        stored[tensor.stored_type] += tensor.num_elements
    verdict = _verdict(estimate, all_sequences, budget)
    return {
        "model": str(inventory.source.path),
        "format": inventory.source.weight_format.value,
        "architecture": inventory.source.model_type,
        "parameters": weights.num_parameters,
        "weights": {
            "stored_types": dict(stored.most_common()),
            "file_bytes": weights.file_bytes,
            "resident_bytes": weights.resident_bytes,
            "device": mx.default_device().type.name,
            "dense": weights.dense,
            "dtype": None if weights.dtype is None else _dtype_name(weights.dtype),
        },
        "layers": arch.num_layers,
        # A model without attention layers has no heads to report.
        "heads": arch.num_heads if has_kv else None,
        "kv_heads": arch.num_kv_heads if has_kv else None,
        "head_dim": arch.head_dim if has_kv else None,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "vocab_size": arch.vocab_size,
        "context_length": arch.context_length,
        "ctx_size": tokens,
        "parallel": args.parallel,
        "kv_dtype": _dtype_name(activation_dtype(inventory, options)),
        "kv_cache": _kv_table(geometry, tokens, args),
        "windowed_layers": _windowed_layers(geometry),
        "state_layers": len(geometry.state_layers),
        "cache_type_k": request.cache_type_k,
        "cache_type_v": request.cache_type_v,
        "cache_residual": request.residual_window(tokens),
        "memory": {
            "weights": estimate.weights,
            "kv_cache": estimate.kv_cache,
            "residual": estimate.residual,
            "activations": estimate.activations,
            "states": estimate.states,
            "total": estimate.total,
            "total_parallel": all_sequences.total,
            "usable": budget.usable_bytes,
            "device": budget.device_bytes,
            "available": budget.available_bytes,
            "utilization": budget.utilization,
        },
        "fits": verdict.fits,
        "margin_bytes": verdict.margin_bytes,
        "warnings": [] if warning is None else [warning],
    }


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


def format_report(report: dict[str, Any]) -> str:
    """The text `inspect` prints for `report` (from `inspect_model`)."""
    weights, memory = report["weights"], report["memory"]
    total = sum(weights["stored_types"].values())
    stored = ", ".join(
        f"{name} {_share(count / total)}" for name, count in weights["stored_types"].items()
    )
    if weights["dense"]:
        held = f"{weights['dtype']}, quantized layers made dense at load"
    else:
        held = weights["dtype"] or "the file's dtypes"
    lines = [
        f"model         {report['model']}",
        f"format        {report['format']}, {report['architecture']}",
        f"parameters    {report['parameters'] / 1e6:.1f} M",
        f"weights       {stored} of parameters; {format_bytes(weights['file_bytes'])} on disk",
        f"resident      {format_bytes(weights['resident_bytes'])} on {weights['device']} ({held})",
        f"shape         {report['layers']} layers, {_heads_text(report)}hidden "
        f"{report['hidden_size']}, MLP {report['intermediate_size']}, vocab "
        f"{report['vocab_size']}",
        f"context       {report['context_length']} tokens trained; -c {report['ctx_size']}, "
        f"-np {report['parallel']}",
        "",
        *_cache_lines(report),
    ]
    estimate = MemoryEstimate(
        memory["weights"],
        memory["kv_cache"],
        memory["activations"],
        memory["states"],
        memory["residual"],
    )
    budget = MemoryBudget(memory["device"], memory["available"], memory["utilization"])
    lines += [
        "",
        f"memory        {breakdown(estimate)} for one sequence of {report['ctx_size']} tokens"
        f"{_cache_types_text(report)}; "
        f"{format_bytes(memory['total_parallel'])} for {report['parallel']}",
        f"budget        {describe_budget(budget)}",
        f"verdict       {_verdict_text(report)}",
    ]
    return "\n".join(lines)


def _heads_text(report: dict[str, Any]) -> str:
    if report["heads"] is None:
        return ""
    return (
        f"{report['heads']} heads, {report['kv_heads']} KV heads, head dim {report['head_dim']}, "
    )


def _cache_types_text(report: dict[str, Any]) -> str:
    if not report["kv_cache"]:
        return ""
    residual = f", --cache-residual {report['cache_residual']}" if report["cache_residual"] else ""
    return f" (-ctk {report['cache_type_k']}, -ctv {report['cache_type_v']}{residual})"


def _cache_lines(report: dict[str, Any]) -> list[str]:
    """The KV cache table (none for a model without attention layers), then the
    recurrent state each sequence keeps, if any."""
    states = report["memory"]["states"]
    state_line = (
        f"recurrent state  {format_bytes(states)} per sequence "
        f"({report['state_layers']} state layers; no prefix caching)"
    )
    if not report["kv_cache"]:
        return ["KV cache      none: the layers keep recurrent state only", state_line]
    lines = [
        f"KV cache (keys + values, {report['layers']} layers{_windows_text(report)}; "
        f"auto = {report['kv_dtype']})",
        f"  {'type':<8} {'bytes/token':>12} {'-c tokens':>12} {'x -np':>12}",
    ]
    for row in report["kv_cache"]:
        if "error" in row:
            lines.append(f"  {row['type']:<8} n/a: {row['error']}")
            continue
        lines.append(
            f"  {row['type']:<8} {row['bytes_per_token']:>12,} "
            f"{format_bytes(row['context_bytes']):>12} {format_bytes(row['parallel_bytes']):>12}"
        )
    return [*lines, state_line] if states else lines


def _windows_text(report: dict[str, Any]) -> str:
    """Which layers hold a window of positions only, for the KV cache's heading."""
    return "".join(
        f", {count} of them reading only the last {window} tokens"
        for window, count in report["windowed_layers"].items()
    )


def _share(fraction: float) -> str:
    return f"{fraction:.1%}" if fraction >= 0.001 else "<0.1%"


def _verdict_text(report: dict[str, Any]) -> str:
    margin = format_bytes(abs(report["margin_bytes"]))
    sequences = f"{report['parallel']} sequences of {report['ctx_size']} tokens"
    if report["fits"] == "all":
        return f"fits: {sequences}, {margin} to spare"
    if report["fits"] == "one":
        return (
            f"fits one sequence of {report['ctx_size']} tokens ({margin} to spare), not "
            f"{sequences}: the engine runs fewer at once when they are long"
        )
    return f"does not fit: {margin} short for one sequence of {report['ctx_size']} tokens"


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    resolve_store_flags(args, environ)
    report = inspect_model(args, device_memory_budget_from(args))
    for warning in report["warnings"]:
        print(f"mlxcel: {warning}", file=err)
    if args.json:
        print(json.dumps(report, indent=2), file=out)
    else:
        print(format_report(report), file=out)
    return 0


def device_memory_budget_from(args: argparse.Namespace) -> MemoryBudget:
    """The device's budget with `--gpu-memory-utilization`.

    Raises:
        UsageError: the utilization is outside (0, 1].
    """
    try:
        return device_memory_budget(args.memory_utilization)
    except ValueError as error:
        raise UsageError(f"--gpu-memory-utilization: {error}") from error
