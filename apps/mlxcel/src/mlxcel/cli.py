"""The `mlxcel` command: `main(argv) -> int` dispatching to subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from typing import NoReturn, TextIO

from mlxcel import bench_command, generate_command
from mlxcel.flags import InputError, UsageError
from mlxcel_core.generate import ContextOverflowError
from mlxcel_models.errors import ModelLoadError

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting, so `main` returns an exit code."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlxcel", description="LLM inference on MLX.")
    parser.add_argument("--version", action="version", version=f"mlxcel {version('mlxcel')}")
    subparsers = parser.add_subparsers(title="commands", required=True, parser_class=_Parser)
    generate_command.add_parser(subparsers)
    bench_command.add_parser(subparsers)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run one `mlxcel` command; return its exit code.

    Errors in user input (flags, prompt, model files) print one line on stderr and return
    a non-zero code: 2 for usage, 1 for a model or prompt that cannot be used.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    environ = os.environ if environ is None else environ
    try:
        args = make_parser().parse_args(argv)
        return args.command(args, environ, out, err)
    except UsageError as error:
        _report(err, error)
        return EXIT_USAGE
    except (InputError, ModelLoadError, ContextOverflowError) as error:
        _report(err, error)
        return EXIT_FAILURE
    except BrokenPipeError:
        raise
    except OSError as error:  # writing the output failed (disk full, closed terminal)
        _report(err, f"cannot write the output: {error.strerror or error}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("mlxcel: interrupted", file=err)
        return EXIT_INTERRUPTED
    except SystemExit as exit_:  # --help and --version
        return exit_.code if isinstance(exit_.code, int) else 0


def _report(err: TextIO, error: Exception | str) -> None:
    """Print an error on one line, whatever line breaks its message holds."""
    print(f"mlxcel: error: {' '.join(str(error).split())}", file=err)
