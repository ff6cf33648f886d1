"""llama-server flags that pasted command lines carry, taken by `generate`, `run`, `serve`
and `bench`.

Those with a meaning on MLX get it: `-t/--threads` sets the CPU BLAS threads (OpenBLAS,
which `mlxcel` preloads on Linux), `-v/--verbose` logs mlxcel's own messages. Those with
none are accepted so that a llama-server command line runs, and each one given says on
stderr, in one line, why it does nothing (`IGNORED_FLAGS`). Any other llama.cpp flag is
still refused by name.
"""

from __future__ import annotations

import argparse
import logging
from typing import TextIO

from mlxcel.common.blas_threads import limit_own_blas_threads, machine_cores
from mlxcel.common.flags import Flag, UsageError

THREADS_FLAG = Flag(
    ("-t", "--threads"),
    "threads",
    int,
    -1,
    "CPU threads for matrix products (OpenBLAS); -1 = the cores MLX's own work leaves",
    env="LLAMA_ARG_THREADS",
)
VERBOSE_FLAG = Flag(
    ("-v", "--verbose"),
    "verbose",
    bool,
    False,
    "log mlxcel's own messages (engine decisions, surgery edits) on stderr",
    is_switch=True,
)
FLASH_ATTENTION_VALUES = ("on", "off", "auto")
# Each flag with no meaning on MLX, and why; its value is checked as llama-server checks it.
IGNORED_FLAGS: tuple[tuple[Flag, str], ...] = (
    (Flag(("-ngl", "--gpu-layers", "--n-gpu-layers"), "n_gpu_layers", str, None,
          "accepted for llama-server command lines; ignored",
          env="LLAMA_ARG_N_GPU_LAYERS"),
     "MLX runs every layer on its one device"),
    (Flag(("-fa", "--flash-attn"), "flash_attn", str, None,
          "accepted for llama-server command lines (on, off, auto); ignored",
          env="LLAMA_ARG_FLASH_ATTN", optional_value="on"),
     "mlxcel chooses its attention kernels itself"),
    (Flag(("--jinja",), "jinja", bool, False,
          "accepted for llama-server command lines; chat templates are always Jinja",
          is_switch=True),
     "chat templates are always rendered with Jinja"),
    (Flag(("-tb", "--threads-batch"), "threads_batch", int, None,
          "accepted for llama-server command lines; ignored (-t sets the threads)",
          env="LLAMA_ARG_THREADS_BATCH"),
     "prompt processing and generation share one BLAS thread count, which -t sets"),
    (Flag(("-cb", "--cont-batching"), "cont_batching", bool, False,
          "accepted for llama-server command lines; batching is always continuous",
          env="LLAMA_ARG_CONT_BATCHING", is_switch=True),
     "mlxcel's engine always batches continuously"),
    (Flag(("--mlock",), "mlock", bool, False,
          "accepted for llama-server command lines; ignored", env="LLAMA_ARG_MLOCK",
          is_switch=True),
     "MLX allocates and keeps the weights' memory itself; mlxcel does not lock it"),
    (Flag(("--no-mmap",), "no_mmap", bool, False,
          "accepted for llama-server command lines; ignored", env="LLAMA_ARG_NO_MMAP",
          is_switch=True),
     "MLX reads the weights into its own buffers; they are never memory-mapped"),
    (Flag(("--no-warmup",), "no_warmup", bool, False,
          "accepted for llama-server command lines; ignored", is_switch=True),
     "the engine's start-up pass sizes the KV cache and cannot be skipped"),
)  # fmt: skip
LLAMA_SERVER_FLAGS = (THREADS_FLAG, VERBOSE_FLAG, *(flag for flag, _ in IGNORED_FLAGS))
# mlxcel's packages, whose loggers -v/--verbose shows at INFO level and below.
_PACKAGE_LOGGERS = ("mlxcel", "mlxcel_core", "mlxcel_models", "mlxcel_server")
_HANDLER_NAME = "mlxcel-verbose"


def apply_llama_server_flags(args: argparse.Namespace, err: TextIO) -> None:
    """Act on the resolved `LLAMA_SERVER_FLAGS`: set the BLAS threads (`-t`), log at INFO
    level (`-v`), and print one line on `err` for each ignored flag given.

    Raises:
        UsageError: a value llama-server would refuse too (`-t 0`, `-fa maybe`).
    """
    _check_values(args)
    for flag, reason in IGNORED_FLAGS:
        if getattr(args, flag.dest) not in (None, False):
            print(f"mlxcel: {'/'.join(flag.names)} ignored: {reason}", file=err)
    if args.threads > 0:
        _set_blas_threads(args.threads, err)
    if args.verbose:
        _log_verbosely(err)


def _set_blas_threads(threads: int, err: TextIO) -> None:
    """Give OpenBLAS `threads` threads, at most one per core: OpenBLAS's own thread count
    from the environment stops at the cores, but `openblas_set_num_threads` does not, and
    workers beyond the cores spin on each other's cores (a 31-token prefill took 11.5 s
    with 3 threads on 2 cores, against 0.5 s with 2)."""
    cores = machine_cores()
    if threads > cores:
        print(
            f"mlxcel: -t/--threads {threads} is above this machine's {cores} cores; "
            f"OpenBLAS runs {cores} threads",
            file=err,
        )
        threads = cores
    if not limit_own_blas_threads(threads):
        print(
            "mlxcel: -t/--threads ignored: this process's BLAS is not OpenBLAS, whose "
            "threads it sets (mlxcel --version says which BLAS runs)",
            file=err,
        )


def _check_values(args: argparse.Namespace) -> None:
    for name, value in (
        ("-t/--threads", args.threads),
        ("-tb/--threads-batch", args.threads_batch),
    ):
        if value is not None and value != -1 and value < 1:
            raise UsageError(f"{name} must be -1 (the default) or >= 1, got {value}")
    if args.flash_attn is not None and args.flash_attn not in FLASH_ATTENTION_VALUES:
        raise UsageError(
            f"-fa/--flash-attn: expected one of {', '.join(FLASH_ATTENTION_VALUES)}, "
            f"got {args.flash_attn!r}"
        )
    layers = args.n_gpu_layers
    if layers is not None and layers not in ("auto", "all") and not _is_count(layers):
        raise UsageError(
            f"-ngl/--n-gpu-layers: expected a number of layers, 'auto' or 'all', got {layers!r}"
        )


def _is_count(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _log_verbosely(err: TextIO) -> None:
    """Send mlxcel's log records of every level to `err` (replacing the handler an
    earlier command of this process set)."""
    handler = logging.StreamHandler(err)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("mlxcel: %(name)s: %(message)s"))
    for name in _PACKAGE_LOGGERS:
        logger = logging.getLogger(name)
        for old in [old for old in logger.handlers if old.get_name() == _HANDLER_NAME]:
            logger.removeHandler(old)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
        logger.propagate = False
