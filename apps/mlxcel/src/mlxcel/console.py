"""Console entry point of `mlxcel`: process setup, kept free of heavy imports.

Four things must happen before MLX is imported:
- On Linux, MLX's CPU wheel links a reference BLAS; the command re-executes itself with
  OpenBLAS preloaded (from PyPI, else the system's; `mlxcel.common.blas`), which makes float
  matrix products many times faster (docs/adr/0003, 0028). `MLXCEL_NO_OPENBLAS=1` turns
  this off.
- OpenBLAS gets the cores MLX's own CPU work leaves (`mlxcel.common.blas_threads`) unless the
  environment sets its thread count: with a thread per core its idle workers spin on the
  cores MLX needs.
- MLX's CUDA backend keeps per-shape state (cuDNN attention plans among it) in LRU caches
  that, once they have missed twice their capacity over the process's life, raise on every
  further miss ("Cache thrashing is happening"). A server keeps meeting new shapes as long
  as it runs (new prompt lengths, prefix-cache offsets, speculative verification passes),
  so that check would turn into failed requests where a miss only costs time: mlxcel turns
  it off (`MLX_ENABLE_CACHE_THRASHING_CHECK=0`) unless the environment sets it.
- Importing MLX and transformers takes a second or more; a Ctrl-C during it must end the
  command as quietly as one during generation.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from mlxcel.common.blas_threads import limit_process_blas_threads

EXIT_INTERRUPTED = 130
THRASHING_CHECK_VARIABLE = "MLX_ENABLE_CACHE_THRASHING_CHECK"


def _reexec_with_openblas(argv: list[str]) -> None:
    if not sys.platform.startswith("linux"):
        return
    from mlxcel.common.blas import preferred_blas

    blas = preferred_blas(os.environ)
    if blas.library is None or blas.is_preloaded(os.environ):
        return
    environment = blas.environment(os.environ)
    os.execve(sys.executable, [sys.executable, "-m", "mlxcel", *argv], environment)


def run() -> NoReturn:
    """Run `mlxcel` with the process's arguments and exit with its code."""
    _run(sys.argv[1:])


def run_server() -> NoReturn:
    """Run `mlxcel-server`, the same as `mlxcel serve`, and exit with its code."""
    _run(["serve", *sys.argv[1:]])


def set_process_defaults() -> None:
    """Set the environment variables mlxcel needs before MLX and transformers load, where
    the environment does not set them already."""
    # mlxcel uses transformers for tokenizers and chat templates only, which need no
    # PyTorch; its advice that PyTorch is missing would only confuse.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault(THRASHING_CHECK_VARIABLE, "0")


def _run(argv: list[str]) -> NoReturn:
    set_process_defaults()
    try:
        _reexec_with_openblas(argv)
        limit_process_blas_threads(os.environ)
        from mlxcel.cli import main

        code = main(argv)
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("mlxcel: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`mlxcel generate ... | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
