"""`mlxcel tune`: search the prefill chunk and the paged decode kernel's split count for a
model on this device, and store the winners for `MLXCEL_AUTOTUNE` (docs/autotune.md).

Each candidate is timed `--rounds` times, interleaved with the others; one replaces the
default only when it beats it by more than the timings' spread. `--show` lists what is
stored for this device and MLX version, `--clear` deletes it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from mlxcel.common.autotune_settings import model_path, prefill_bucket_for
from mlxcel.common.engine_flags import UBATCH_SIZE_FLAG
from mlxcel.common.flags import (
    MODEL_FLAG,
    Flag,
    RunError,
    UsageError,
    add_command,
    resolve_defaults,
)
from mlxcel.common.loading import load_for_command
from mlxcel.common.tables import format_table
from mlxcel.models.store_flags import STORE_FLAGS, resolve_store_flags
from mlxcel.tuning.tune_searches import (
    decode_kernel_skip_reason,
    search_paged_decode_partitions,
    search_prefill_chunk,
)
from mlxcel_core.autotune import SearchResult
from mlxcel_core.autotune.prefill import PREFILL_CHUNK_CANDIDATES, prefill_chunk_candidates
from mlxcel_core.tuning import (
    PAGED_DECODE_PARTITIONS,
    PREFILL_CHUNK,
    TACTICS,
    TunedEntry,
    TuningScope,
    TuningStore,
    autotune_dir,
)
from mlxcel_models.memory import read_model_inventory


def _tactic(text: str) -> str:
    if text not in TACTICS:
        raise ValueError(f"expected one of {', '.join(TACTICS)}")
    return text


def _positive_ints(text: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in text.split(","))
    if any(value < 1 for value in values):
        raise ValueError("every value must be >= 1")
    return values


TUNE_FLAGS = (
    MODEL_FLAG,
    *STORE_FLAGS,
    Flag(("--tactic",), "tactics", _tactic, None,
         f"what to tune, repeatable: {', '.join(TACTICS)} (default: all)",
         env="MLXCEL_TUNE_TACTIC", repeatable=True),
    Flag(("--rounds",), "rounds", int, 7, "timed runs of every candidate (>= 2)",
         env="MLXCEL_TUNE_ROUNDS"),
    Flag(("--tune-prompt-tokens",), "prompt_tokens", int, 2048,
         "length of the prompt whose prefill is timed (tokens; >= 128 to search, below the "
         "model's context)",
         env="MLXCEL_TUNE_PROMPT_TOKENS"),
    Flag(("--tune-decode-rows",), "decode_rows", _positive_ints, (1, 8, 32),
         "sequences decoded together, comma-separated, each rounded up to a power of two",
         env="MLXCEL_TUNE_DECODE_ROWS"),
    Flag(("--tune-decode-context",), "decode_contexts", _positive_ints, (4096, 32768),
         "context lengths (tokens), comma-separated, each rounded up to a power of two",
         env="MLXCEL_TUNE_DECODE_CONTEXT"),
    Flag(("--show",), "show", bool, False,
         "list the values stored for this device and MLX version, and tune nothing",
         env="MLXCEL_TUNE_SHOW", is_switch=True),
    Flag(("--clear",), "clear", bool, False,
         "delete the values stored for this device and MLX version, and tune nothing",
         env="MLXCEL_TUNE_CLEAR", is_switch=True),
)  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "tune", __doc__, TUNE_FLAGS, run)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, TUNE_FLAGS, environ)
    store = TuningStore(autotune_dir(environ), TuningScope.current())
    if args.show or args.clear:
        _check_alone(args)
        if args.show:
            return _show(store, out)
        _check_writable(store)
        return _clear(store, out)
    if args.rounds < 2:
        raise UsageError(f"--rounds must be >= 2, got {args.rounds}")
    if args.prompt_tokens < 1:
        raise UsageError(f"--tune-prompt-tokens must be >= 1, got {args.prompt_tokens}")
    resolve_store_flags(args, environ)
    tactics = tuple(dict.fromkeys(args.tactics or TACTICS))
    _check_tactic_flags(args, tactics)
    path = model_path(args)
    results: list[SearchResult] = []
    if PREFILL_CHUNK in tactics:
        result = _tune_prefill_chunk(args, path, store, err)
        if result is not None:
            _record(store, result, out)
            results.append(result)
    if PAGED_DECODE_PARTITIONS in tactics:
        inventory = read_model_inventory(path)
        skip_reason = decode_kernel_skip_reason(inventory)
        if skip_reason is not None:
            print(f"mlxcel tune: {skip_reason}", file=err)
        else:
            _check_writable(store)
            for result in search_paged_decode_partitions(
                inventory,
                rows=args.decode_rows,
                contexts=args.decode_contexts,
                rounds=args.rounds,
                on_round=lambda bucket, done: _progress(
                    err, f"{PAGED_DECODE_PARTITIONS} [{bucket}]", done, args.rounds
                ),
            ):
                _record(store, result, out)
                results.append(result)
    if results:
        print(f"stored in {store.path}", file=out)
    return 0


def _tune_prefill_chunk(
    args: argparse.Namespace, path: Path, store: TuningStore, err: TextIO
) -> SearchResult | None:
    """Search the prefill chunk for the model at `path`; None when the prompt is too
    short to leave any candidate but the default (said on `err`).

    Raises:
        UsageError: the prompt and its first token do not fit the model's context.
        RunError: the autotune folder cannot be written, or the engine cannot start.
    """
    context = read_model_inventory(path).architecture.context_length
    if args.prompt_tokens >= context:
        raise UsageError(
            f"--tune-prompt-tokens {args.prompt_tokens} does not fit the model's context of "
            f"{context} tokens (at most {context - 1}: the prompt and its first token)"
        )
    default = UBATCH_SIZE_FLAG.default
    candidates = prefill_chunk_candidates(args.prompt_tokens, default)
    if len(candidates) == 1:
        print(
            f"mlxcel tune: a {args.prompt_tokens}-token prompt leaves only the default chunk "
            f"{default}; nothing searched or stored (--tune-prompt-tokens "
            f"{min(PREFILL_CHUNK_CANDIDATES)} or more searches {PREFILL_CHUNK})",
            file=err,
        )
        return None
    _check_writable(store)
    bucket = prefill_bucket_for(path)
    loaded = load_for_command(args.model, store=args.model_store, revision=args.revision)
    print(
        f"mlxcel tune: {PREFILL_CHUNK}: timing chunks {', '.join(map(str, candidates))} "
        f"on a {args.prompt_tokens}-token prompt",
        file=err,
        flush=True,
    )
    result = search_prefill_chunk(
        loaded,
        bucket,
        prompt_tokens=args.prompt_tokens,
        candidates=candidates,
        default=default,
        rounds=args.rounds,
        on_round=lambda done: _progress(err, PREFILL_CHUNK, done, args.rounds),
    )
    del loaded  # the decode kernel's pools need the memory, not the weights
    return result


def _progress(err: TextIO, what: str, done: int, rounds: int) -> None:
    print(f"mlxcel tune: {what}: round {done}/{rounds}", file=err, flush=True)


def _check_writable(store: TuningStore) -> None:
    """Refuse, before any timing, an autotune folder the result could not be stored in.

    Raises:
        RunError: the folder cannot be created or written.
    """
    try:
        store.check_writable()
    except OSError as error:
        reason = error.strerror or str(error)
        raise RunError(f"cannot write the autotune folder {store.directory}: {reason}") from error


def _check_alone(args: argparse.Namespace) -> None:
    others = sorted(args.from_command_line - {"show", "clear"})
    if args.show and args.clear:
        raise UsageError("--show and --clear: give one")
    if others:
        flag = next(f.names[-1] for f in TUNE_FLAGS if f.dest == others[0])
        action = "--show" if args.show else "--clear"
        raise UsageError(f"{action} takes no other flags, got {flag}")


# The flags of one tactic's search, refused when that tactic is not searched.
_TACTIC_FLAGS = {
    PREFILL_CHUNK: ("prompt_tokens",),
    PAGED_DECODE_PARTITIONS: ("decode_rows", "decode_contexts"),
}


def _check_tactic_flags(args: argparse.Namespace, tactics: tuple[str, ...]) -> None:
    for tactic, dests in _TACTIC_FLAGS.items():
        given = [dest for dest in dests if dest in args.from_command_line]
        if given and tactic not in tactics:
            flag = next(f.names[-1] for f in TUNE_FLAGS if f.dest == given[0])
            raise UsageError(f"{flag} applies to --tactic {tactic}, which is not searched")


def _record(store: TuningStore, result: SearchResult, out: TextIO) -> None:
    """Store `result` and print its table: candidates, median, spread, then the verdict."""
    store.record(result.entry())
    verdict = result.verdict
    rows = [
        (
            f"{m.candidate}{' (default)' if m.candidate == verdict.default else ''}",
            f"{m.median * 1e3:.3f}",
            f"{m.spread * 1e3:.3f}",
        )
        for m in result.measurements
    ]
    print(f"{result.tactic} [{result.bucket}]", file=out)
    print(format_table(("candidate", "median ms", "spread ms"), rows), file=out)
    print(verdict.describe(), file=out, flush=True)


def _show(store: TuningStore, out: TextIO) -> int:
    entries = sorted(store.read().values(), key=lambda entry: (entry.tactic, entry.bucket))
    if not entries:
        ignored = store.ignored_reason()
        if ignored is not None:
            print(f"ignored {store.path}: it {ignored}", file=out)
        print(f"nothing tuned for {store.scope.device}, MLX {store.scope.mlx_version}", file=out)
        return 0
    print(f"tuned for {store.scope.device}, MLX {store.scope.mlx_version} ({store.path})", file=out)
    rows = [_show_row(entry) for entry in entries]
    print(format_table(("tactic", "bucket", "value", "default", "speedup"), rows), file=out)
    return 0


def _show_row(entry: TunedEntry) -> tuple[str, str, str, str, str]:
    speedup = entry.default_median_seconds / entry.median_seconds
    return entry.tactic, entry.bucket, str(entry.value), str(entry.default), f"{speedup:.2f}x"


def _clear(store: TuningStore, out: TextIO) -> int:
    if store.clear():
        print(f"removed {store.path}", file=out)
    else:
        print(f"nothing tuned for {store.scope.device}, MLX {store.scope.mlx_version}", file=out)
    return 0
