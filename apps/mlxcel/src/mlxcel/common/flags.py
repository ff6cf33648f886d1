"""llama-server's flag names, defaults and `LLAMA_ARG_*` environment mirrors.

Each flag's environment variable is llama-server's documented name where it has one, else
`LLAMA_ARG_` plus the long flag in upper snake case (`--repeat-penalty` ->
`LLAMA_ARG_REPEAT_PENALTY`). The command line wins over the environment, which wins over
the default.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from mlxcel_core.errors import InputError, MlxcelError, ParamError
from mlxcel_core.sampling import SamplingParams, parse_sampler_order


class UsageError(InputError):
    """A flag or environment variable has a value the command cannot use (exit code 2).
    Other input errors (the prompt or a file it names cannot be used) exit with code 1."""


class RunError(MlxcelError):
    """The command cannot do its work for a reason outside its input, such as a port
    already in use (exit code 1)."""


def import_extra(module: str, *, extra: str, needed_by: str) -> ModuleType:
    """Import `module`, which mlxcel's optional `extra` brings.

    Raises:
        UsageError: it cannot be imported; the one line names `needed_by` (what asked for
            it, such as a flag), the install command and the import's own error.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise UsageError(
            f"{needed_by} needs the {extra} extra: pip install 'mlxcel[{extra}]' ({error})"
        ) from error


@dataclass(frozen=True)
class Flag:
    """One command-line option.

    Attributes:
        names: its spellings, long name last (`-n`, `--n-predict`).
        dest: the attribute name on the parsed namespace.
        type: converts the text given on the command line or in the environment.
        default: the value when neither gives one.
        help: one line for `--help`.
        env: the environment variable mirroring it; derived from the long name if empty.
        is_switch: a flag without a value (its environment mirror takes 1/0/true/false).
        repeatable: the flag may be given several times; its value is the list of them
            (its environment mirror gives one).
        metavar: the names of its values when it takes several (`--lora-scaled PATH
            SCALE`); `type` then converts the list of them, and the environment mirror
            gives them space-separated, the last ones without spaces.
        optional_value: the flag's value when it is given without one (`-fa` for
            `-fa on`); None for a flag whose value is required.
    """

    names: tuple[str, ...]
    dest: str
    type: Callable[[str], Any]
    default: Any
    help: str
    env: str = ""
    is_switch: bool = False
    repeatable: bool = False
    metavar: tuple[str, ...] = ()
    optional_value: str | None = None

    @property
    def env_name(self) -> str:
        if self.env:
            return self.env
        return "LLAMA_ARG_" + self.names[-1].lstrip("-").replace("-", "_").upper()


def flag_error(message: str, flag_names: Mapping[str, str]) -> UsageError:
    """A config's `ValueError` message as a usage error naming flags, not fields
    (`"max_num_seqs must be >= 1"` -> `"-np/--parallel must be >= 1"`)."""
    for field, flag in flag_names.items():
        message = re.sub(rf"\b{field}\b", flag, message)
    return UsageError(message)


def _switch_value(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on", "enabled"):
        return True
    if lowered in ("0", "false", "no", "off", "disabled"):
        return False
    raise ValueError(f"expected 1/0/true/false, got {text!r}")


MODEL_FLAG = Flag(
    ("-m", "--model"),
    "model",
    str,
    None,
    "a GGUF file, a safetensors folder or a Hugging Face id, owner/name[:QUANT] "
    "(default: embedded SmolLM2-135M)",
)
CTX_SIZE_FLAG = Flag(
    ("-c", "--ctx-size"),
    "ctx_size",
    int,
    4096,
    "context size in tokens; 0 = the model's trained context",
    env="LLAMA_ARG_CTX_SIZE",
)
N_PREDICT_FLAG = Flag(
    ("-n", "--n-predict"),
    "n_predict",
    int,
    -1,
    "tokens to generate; -1 = until the context is full",
    env="LLAMA_ARG_N_PREDICT",
)
BATCH_SIZE_FLAG = Flag(
    ("-b", "--batch-size"),
    "batch_size",
    int,
    2048,
    "prompt tokens per prefill step",
    env="LLAMA_ARG_BATCH",
)

SAMPLING_FLAGS = (
    Flag(("--temp",), "temperature", float, 0.8, "temperature; 0 = greedy"),
    Flag(("--top-k",), "top_k", int, 40, "top-k sampling; 0 = off"),
    Flag(("--top-p",), "top_p", float, 0.95, "top-p sampling; 1.0 = off"),
    Flag(("--min-p",), "min_p", float, 0.05, "min-p sampling; 0.0 = off"),
    Flag(("--typical",), "typical_p", float, 1.0, "locally typical sampling; 1.0 = off"),
    Flag(("--top-nsigma",), "top_n_sigma", float, -1.0, "top-n-sigma sampling; -1 = off"),
    Flag(("--xtc-probability",), "xtc_probability", float, 0.0, "XTC probability; 0 = off"),
    Flag(("--xtc-threshold",), "xtc_threshold", float, 0.1, "XTC threshold; > 0.5 = off"),
    Flag(("--repeat-penalty",), "repeat_penalty", float, 1.0,
         "repetition penalty; 1.0 = off"),
    Flag(("--repeat-last-n",), "repeat_last_n", int, 64,
         "tokens the penalties look back; 0 = off, -1 = context size"),
    Flag(("--presence-penalty",), "presence_penalty", float, 0.0, "presence penalty; 0 = off"),
    Flag(("--frequency-penalty",), "frequency_penalty", float, 0.0,
         "frequency penalty; 0 = off"),
    Flag(("--dry-multiplier",), "dry_multiplier", float, 0.0, "DRY multiplier; 0 = off"),
    Flag(("--dry-base",), "dry_base", float, 1.75, "DRY base"),
    Flag(("--dry-allowed-length",), "dry_allowed_length", int, 2,
         "longest repetition DRY allows"),
    Flag(("--dry-penalty-last-n",), "dry_penalty_last_n", int, -1,
         "tokens DRY scans; 0 = off, -1 = context size"),
    Flag(("--dry-sequence-breaker",), "dry_sequence_breakers", str, None,
         "a string that ends a DRY repetition (repeatable; 'none' clears the defaults)",
         repeatable=True),
    Flag(("--samplers",), "samplers", parse_sampler_order, None,
         "sampler order, ';'-separated names or a letter sequence (default: "
         "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)"),
    Flag(("-s", "--seed"), "seed", int, -1, "random seed; -1 = random"),
)  # fmt: skip


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    description: str | None,
    flags: tuple[Flag, ...],
    run: Callable[..., int],
) -> None:
    """Declare subcommand `name` with `flags`; parsing it sets `command=run`."""
    parser = subparsers.add_parser(name, description=description)
    add_flags(parser, flags)
    parser.set_defaults(command=run)


def add_flags(parser: argparse.ArgumentParser, flags: tuple[Flag, ...]) -> None:
    """Declare `flags` on `parser`; defaults are resolved later by `resolve_defaults`."""
    for flag in flags:
        default = "" if flag.default is None or flag.is_switch else f"default: {flag.default}; "
        help_text = f"{flag.help} ({default}env: {flag.env_name})"
        if flag.is_switch:
            parser.add_argument(
                *flag.names, dest=flag.dest, action="store_const", const=True, help=help_text
            )
        elif flag.metavar:
            parser.add_argument(
                *flag.names,
                dest=flag.dest,
                action="append",
                nargs=len(flag.metavar),
                metavar=flag.metavar,
                help=help_text,
            )
        elif flag.repeatable:
            parser.add_argument(*flag.names, dest=flag.dest, action="append", help=help_text)
        elif flag.optional_value is not None:
            parser.add_argument(
                *flag.names, dest=flag.dest, nargs="?", const=flag.optional_value, help=help_text
            )
        else:
            parser.add_argument(*flag.names, dest=flag.dest, type=str, help=help_text)


def resolve_defaults(
    namespace: argparse.Namespace, flags: tuple[Flag, ...], environ: Mapping[str, str]
) -> None:
    """Convert each flag's text, falling back to its environment mirror, then its default.

    Records the flags given on the command line in `namespace.from_command_line`, so that
    either-or checks can let the command line win over the environment, and those whose
    value came from their environment variable in `namespace.from_environment`, so that
    errors about them name the variable (`name_environment_values`).

    Raises:
        UsageError: a value does not convert; the message names the flag or variable.
    """
    namespace.from_command_line = {
        flag.dest for flag in flags if getattr(namespace, flag.dest) is not None
    }
    namespace.from_environment = tuple(
        flag
        for flag in flags
        if flag.dest not in namespace.from_command_line and flag.env_name in environ
    )
    for flag in flags:
        given = getattr(namespace, flag.dest)
        source = flag.names[-1]
        if given is None and flag.env_name in environ:
            given, source = environ[flag.env_name], flag.env_name
            if flag.metavar:
                given = given.rsplit(maxsplit=len(flag.metavar) - 1)
            if flag.repeatable:
                given = [given]
        if given is None:
            setattr(namespace, flag.dest, flag.default)
            continue
        convert = _switch_value if flag.is_switch else flag.type
        try:
            if isinstance(given, list):
                value: Any = [convert(item) for item in given]
            elif isinstance(given, bool):
                value = given
            else:
                value = convert(given)
        except ValueError as error:
            raise _conversion_error(flag, source, given, error) from error
        setattr(namespace, flag.dest, value)


def name_environment_values(message: str, namespace: argparse.Namespace) -> str:
    """`message` with every flag whose value came from its environment variable
    (`namespace.from_environment`) named by that variable, as conversion errors name it:
    `LLAMA_ARG_CACHE_RESIDUAL=-3` is refused as "LLAMA_ARG_CACHE_RESIDUAL must be >= 0,
    got -3", not under a flag the user never typed. A flag is matched as messages spell
    it: all its names ("-np/--parallel") or its long name alone ("--parallel")."""
    for flag in namespace.from_environment:
        spellings = ("/".join(flag.names), flag.names[-1])
        pattern = "|".join(re.escape(spelling) for spelling in spellings)
        message = re.sub(rf"(?<![\w/-])(?:{pattern})(?![\w/-])", flag.env_name, message)
    return message


# What a value of a built-in flag type must be, in the words of a conversion error.
_EXPECTED = {int: "an integer", float: "a number"}


def _conversion_error(flag: Flag, source: str, given: Any, error: ValueError) -> UsageError:
    """`--seed: expected an integer, got 'abc'` for a number flag; the converter's own
    message, with the value, for any other."""
    expected = None if flag.is_switch else _EXPECTED.get(flag.type)
    if expected is not None:
        return UsageError(f"{source}: expected {expected}, got {given!r}")
    return UsageError(f"{source}: invalid value {given!r} ({error})")


def sampling_params_from(namespace: argparse.Namespace) -> SamplingParams:
    """Build validated `SamplingParams` from parsed sampling flags.

    Raises:
        UsageError: a value is out of range; the message names the parameter.
    """
    options: dict[str, Any] = {
        flag.dest: getattr(namespace, flag.dest)
        for flag in SAMPLING_FLAGS
        if flag.dest not in ("samplers", "seed", "dry_sequence_breakers")
    }
    if namespace.samplers is not None:
        options["samplers"] = namespace.samplers
    if namespace.dry_sequence_breakers is not None:
        breakers = namespace.dry_sequence_breakers
        options["dry_sequence_breakers"] = () if breakers == ["none"] else tuple(breakers)
    options["seed"] = None if namespace.seed < 0 else namespace.seed
    try:
        return SamplingParams(**options)
    except ParamError as error:
        flag = next((f for f in SAMPLING_FLAGS if f.dest == error.param), None)
        raise UsageError(f"{flag.names[-1]}: {error}" if flag else str(error)) from error


def pick_one(namespace: argparse.Namespace, dests: tuple[str, ...], what: str) -> str | None:
    """The dest of whichever of mutually exclusive flags is set, the command line winning.

    Raises:
        UsageError: several are set by the same source.
    """
    values = {dest: getattr(namespace, dest) for dest in dests}
    given = [dest for dest, value in values.items() if value is not None]
    if len(given) < 2:
        return given[0] if given else None
    on_command_line = [dest for dest in given if dest in namespace.from_command_line]
    if len(on_command_line) == 1:
        return on_command_line[0]
    raise UsageError(f"give {what}, only one")
