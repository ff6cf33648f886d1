"""Sharing the CPU's cores among the ranks one machine runs (`--tp`, `--pp`,
`--disaggregate` without a launcher).

OpenBLAS starts one thread per core in every process. Ranks on one machine then spin on
cores the other ranks need: PP 2 on two cores decodes at 0.4 tokens/s with the default
threads against 1.8-2.1 with one thread per rank (docs/benchmarks.md). Each rank gets the
machine's cores divided by the ranks, unless `OPENBLAS_NUM_THREADS` says otherwise.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"


def threads_per_rank(num_ranks: int) -> int:
    """The BLAS threads each of `num_ranks` ranks on this machine gets (>= 1)."""
    return max(1, (os.cpu_count() or 1) // num_ranks)


def rank_blas_environment(environ: Mapping[str, str], num_ranks: int) -> dict[str, str]:
    """The variables a rank started on this machine needs so its BLAS takes its share of
    the cores: none when `environ` already sets `OPENBLAS_NUM_THREADS`."""
    if THREADS_VARIABLE in environ:
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
