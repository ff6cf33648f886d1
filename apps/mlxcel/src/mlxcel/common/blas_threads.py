"""How many threads OpenBLAS runs in an `mlxcel` process, and in the ranks one machine
runs (`--tp`, `--pp`, `--disaggregate` without a launcher).

OpenBLAS starts one thread per core, and its idle workers spin for a while after each
product. MLX's own CPU work (its CPU stream's thread, which runs every other operation, and
the Python thread building the next step) keeps about a core busy beside them, so with a
thread per core the workers spin on cores MLX needs; OpenBLAS 0.3.33 (the PyPI build) then
runs its products many times slower as soon as other work takes a core too
(docs/adr/0028-openblas-from-pypi.md). One process gets the cores MLX leaves, at least one
(`process_threads`). Ranks on one machine likewise spin on cores the other ranks need: PP 2
on two cores decodes at 0.4 tokens/s with the default threads against 1.8-2.1 with one
thread per rank (docs/benchmarks.md); each rank gets the machine's cores divided by the
ranks. A thread count the environment sets (`OPENBLAS_NUM_THREADS`, or `OMP_NUM_THREADS`,
which OpenBLAS also reads) is kept.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"
# The variables OpenBLAS takes its thread count from, first found first.
_THREAD_COUNT_VARIABLES = (THREADS_VARIABLE, "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
# Cores MLX's own CPU work keeps busy beside the BLAS threads.
MLX_CORES = 1


def sets_threads(environ: Mapping[str, str]) -> bool:
    """Whether `environ` sets OpenBLAS's thread count."""
    return any(environ.get(name) for name in _THREAD_COUNT_VARIABLES)


def machine_cores() -> int:
    """The machine's cores, as the BLAS thread counts here read them."""
    return os.cpu_count() or 1


def process_threads() -> int:
    """The BLAS threads of one `mlxcel` process: the cores MLX's own CPU work leaves,
    at least 1."""
    return max(1, machine_cores() - MLX_CORES)


def with_process_threads(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with OpenBLAS given `process_threads()` threads unless it sets a count: for
    a process started beside the `mlxcel` command that should run its BLAS the same way."""
    if sets_threads(environ):
        return dict(environ)
    return {**environ, THREADS_VARIABLE: str(process_threads())}


def limit_process_blas_threads(environ: Mapping[str, str]) -> bool:
    """Give this process's OpenBLAS `process_threads()` threads unless `environ` sets a
    count; whether OpenBLAS is loaded and was limited."""
    return not sets_threads(environ) and limit_own_blas_threads(process_threads())


def threads_per_rank(num_ranks: int) -> int:
    """The BLAS threads each of `num_ranks` ranks on this machine gets (>= 1)."""
    return max(1, machine_cores() // num_ranks)


def rank_blas_environment(environ: Mapping[str, str], num_ranks: int) -> dict[str, str]:
    """The variables a rank started on this machine needs so its BLAS takes its share of
    the cores: none when `environ` already sets OpenBLAS's thread count."""
    if sets_threads(environ):
        return {}
    return {THREADS_VARIABLE: str(threads_per_rank(num_ranks))}


def limit_own_blas_threads(count: int) -> bool:
    """Set this process's OpenBLAS threads to `count` if OpenBLAS is loaded (the `mlxcel`
    command preloads it on Linux); whether it was."""
    try:
        set_threads = ctypes.CDLL(None).openblas_set_num_threads
    except (AttributeError, OSError):
        return False
    set_threads(count)
    return True
