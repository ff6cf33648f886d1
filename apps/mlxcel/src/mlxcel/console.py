"""Console entry point of `mlxcel`, kept free of heavy imports.

Importing MLX and transformers takes a second or more; a Ctrl-C during it must end the
command as quietly as one during generation.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

EXIT_INTERRUPTED = 130


def run() -> NoReturn:
    """Run `mlxcel` with the process's arguments and exit with its code."""
    try:
        from mlxcel.cli import main

        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("mlxcel: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`mlxcel generate ... | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
