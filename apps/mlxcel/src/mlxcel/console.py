"""Console entry point of `mlxcel`: process setup, kept free of heavy imports.

Two things must happen before MLX is imported:
- On Linux, MLX's CPU wheel links a reference BLAS; when OpenBLAS is installed the command
  re-executes itself with OpenBLAS preloaded, which makes float matrix products several
  times faster (docs/adr/0003). `MLXCEL_NO_OPENBLAS=1` turns this off.
- Importing MLX and transformers takes a second or more; a Ctrl-C during it must end the
  command as quietly as one during generation.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

EXIT_INTERRUPTED = 130
NO_OPENBLAS_VARIABLE = "MLXCEL_NO_OPENBLAS"
# Debian's and Ubuntu's libopenblas0-pthread.
OPENBLAS_LIBRARIES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
)


def _reexec_with_openblas(argv: list[str]) -> None:
    if not sys.platform.startswith("linux") or os.environ.get(NO_OPENBLAS_VARIABLE):
        return
    library = next((path for path in OPENBLAS_LIBRARIES if os.path.exists(path)), None)
    preload = os.environ.get("LD_PRELOAD", "")
    if library is None or library in preload:
        return
    environment = {**os.environ, "LD_PRELOAD": f"{library}:{preload}" if preload else library}
    os.execve(sys.executable, [sys.executable, "-m", "mlxcel", *argv], environment)


def run() -> NoReturn:
    """Run `mlxcel` with the process's arguments and exit with its code."""
    _run(sys.argv[1:])


def run_server() -> NoReturn:
    """Run `mlxcel-server`, the same as `mlxcel serve`, and exit with its code."""
    _run(["serve", *sys.argv[1:]])


def _run(argv: list[str]) -> NoReturn:
    # mlxcel uses transformers for tokenizers and chat templates only, which need no
    # PyTorch; its advice that PyTorch is missing would only confuse.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        _reexec_with_openblas(argv)
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
