"""The `mlxcel` command: `main(argv) -> int` dispatching to subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn, TextIO

from mlxcel.common.blas import describe_blas
from mlxcel.common.flags import RunError, UsageError, name_environment_values
from mlxcel_core.errors import InputError

# Subcommand -> (module, one-line help). A command's module, and the libraries it needs
# (the server stack for `serve`, mlx-lm's generator for `bench`), load only when it runs.
COMMANDS = {
    "generate": ("mlxcel.generation.generate_command", "generate text for one prompt"),
    "run": ("mlxcel.generation.run_command", "chat with a model in the terminal"),
    "bench": ("mlxcel.tuning.bench_command", "measure prompt and generation speed"),
    "serve": ("mlxcel.serving.serve_command", "serve the OpenAI-compatible HTTP API"),
    "list": ("mlxcel.models.list_command", "list the models in the store"),
    "rm": ("mlxcel.models.rm_command", "delete a model from the store"),
    "arch": ("mlxcel.models.arch_command", "list the supported architectures and their features"),
    "inspect": ("mlxcel.models.inspect_command", "estimate a model's memory and whether it fits"),
    "tune": (
        "mlxcel.tuning.tune_command",
        "search and store the fastest prefill chunk and kernel splits",
    ),
    "transcribe": ("mlxcel.speech.transcribe_command", "transcribe speech in an audio file"),
    "speak": ("mlxcel.speech.speak_command", "speak text with a Piper voice (text-to-speech)"),
}
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


# A single-dash word such as llama.cpp's `-ngl` or `-hf`.
_SHORT_WORD = re.compile(r"-[A-Za-z][A-Za-z0-9-]+")
_NUMBER = re.compile(r"-?\d+(\.\d*)?([eE][-+]?\d+)?")


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting, so `main` returns an exit code; takes flags whole, as
    llama.cpp does: no abbreviated long flags (`--tem` for `--temp`), and an unknown
    single-dash word (`-ngl`, `-hf`) is not read as a known short flag and its value
    (`-n gl`, `-h -f`). So only a number may be attached to a short flag (`-n128`);
    other values go apart or after `=` (`-m model`, `-m=model`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # The parser of a command sees the command's own arguments (the top one sees all).
        if self._subparsers is None:
            for arg in args or ():
                if arg == "--":  # what follows is positional, dashes and all
                    break
                if self._is_unknown_short_word(arg):
                    self.error(f"unrecognized arguments: {arg}")
        return super().parse_known_args(args, namespace)

    def _is_unknown_short_word(self, arg: str) -> bool:
        """`arg` looks like a flag of its own and is none of this parser's; a known short
        flag with its number attached (`-n128`) is one."""
        if not _SHORT_WORD.fullmatch(arg) or arg in self._option_string_actions:
            return False
        action = self._option_string_actions.get(arg[:2])
        return not (action is not None and action.nargs != 0 and _NUMBER.fullmatch(arg[2:]))

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def make_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `mlxcel` parser, with the full flags of `command` only (the others listed).

    Raises:
        UsageError: `command`'s module cannot be imported (an extra it needs is missing).
    """
    parser = _Parser(
        prog="mlxcel",
        description="LLM inference on MLX.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the version's lines
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="show the version, BLAS and CPU kernels"
    )
    subparsers = parser.add_subparsers(title="commands", required=True, parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        if name == command:
            try:
                command_module = importlib.import_module(module)
            except ImportError as error:  # the command needs an extra that is not installed
                raise UsageError(str(error)) from error
            command_module.add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_text)
    return parser


class _VersionAction(argparse.Action):
    """argparse's `version` action with the text made only when `--version` is given: it
    imports MLX and may build the CPU kernels, which no other command should wait for."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        formatter = parser._get_formatter()
        formatter.add_text(_version_text())
        parser._print_message(formatter.format_help(), sys.stdout)
        parser.exit()


def _version_text() -> str:
    """`mlxcel VERSION`, then, on Linux, the BLAS this process runs with and what computes
    decode products of quantized and of float32 weights, the SwiGLU activation and decode
    attention over float32 paged KV on the CPU."""
    text = f"mlxcel {_installed_version()}"
    if sys.platform.startswith("linux"):
        # MLX is imported only now: the BLAS preload must see a process without it.
        from mlxcel_core.kernels.cpu_matvec import describe_cpu_kernels
        from mlxcel_core.kernels.cpu_matvec.dense import describe_cpu_dense_products
        from mlxcel_core.kernels.cpu_matvec.paged_attention import describe_cpu_paged_attention
        from mlxcel_core.kernels.cpu_matvec.swiglu import describe_cpu_swiglu

        text += "\n" + describe_blas(os.environ)
        text += f"\nquantized decode products on the CPU: {describe_cpu_kernels()}"
        text += f"\nfloat32 decode products on the CPU: {describe_cpu_dense_products()}"
        text += f"\nSwiGLU activation on the CPU: {describe_cpu_swiglu()}"
        text += f"\npaged decode attention on the CPU: {describe_cpu_paged_attention()}"
    return text


def _installed_version() -> str:
    try:
        return version("mlxcel")
    except PackageNotFoundError:  # running from a source tree on PYTHONPATH
        return "(source tree, not installed)"


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
    argv = sys.argv[1:] if argv is None else list(argv)
    # The top-level options take no values, so a subcommand can only be the first argument.
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = argparse.Namespace(from_environment=())
    try:
        args = make_parser(command).parse_args(argv, args)
        args.argv = tuple(argv)  # other ranks of `--tp`/`--pp` run the same command line
        return args.command(args, environ, out, err)
    # A flag is named as the user gave it: by its environment variable when its value
    # came from one (`resolve_defaults` records which), in a refusal or in the advice of
    # a run that failed ("lower --cache-residual or -np/--parallel").
    except UsageError as error:
        _report(err, name_environment_values(str(error), args))
        return EXIT_USAGE
    # Every mlxcel input error: the prompt, a model file, an image, a value out of range.
    except (InputError, RunError) as error:
        _report(err, name_environment_values(str(error), args))
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
