"""`mlxcel arch`: the model architectures mlxcel loads, and what each supports.

Read from the models package's family metadata (`mlxcel_models.metadata.all_families`):
the text families are mlx-lm's, each with the caches its layers keep and what the engine
does with them: no prefix caching, speculative decoding or pipeline stages with recurrent
state. A family whose layers keep a cache of mlx-lm's the engine has no kind for is listed
as not supported, with the reason, since its load is refused. Names given on the command
line select those architectures (case-insensitively).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TextIO

from mlxcel.common.flags import Flag, UsageError, add_flags, resolve_defaults
from mlxcel.common.tables import format_table
from mlxcel_core.cache.layout import CacheKind
from mlxcel_models.metadata import FamilyMetadata, ModelKind, all_families

FLAGS = (
    Flag(("--json",), "json", bool, False, "print a JSON array of the architectures",
         env="MLXCEL_JSON", is_switch=True),
)  # fmt: skip
# What a family of each kind takes in.
INPUTS = {
    ModelKind.TEXT: ("text",),
    ModelKind.VLM: ("text", "vision"),
    ModelKind.AUDIO: ("audio",),
}


# Why the engine refuses a family whose layers keep a cache it has no kind for.
UNSUPPORTED_CACHE = (
    "its layers keep a cache of their own kind (not keys and values, a window or a "
    "recurrent state), which mlxcel's engine cannot hold"
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("arch", description=__doc__)
    parser.add_argument(
        "names", metavar="NAME", nargs="*", help="list only these architectures (any case)"
    )
    add_flags(parser, FLAGS)
    parser.set_defaults(command=run)


def select_families(names: list[str]) -> list[FamilyMetadata]:
    """The families named (case-insensitively), else all; sorted by name, case ignored.

    Raises:
        UsageError: a name is no architecture mlxcel knows.
    """
    families = sorted(all_families().values(), key=lambda family: family.model_type.lower())
    if not names:
        return families
    by_name = {family.model_type.lower(): family for family in families}
    unknown = [name for name in names if name.lower() not in by_name]
    if unknown:
        raise UsageError(f"unknown architecture: {', '.join(unknown)} (mlxcel arch lists them all)")
    wanted = {name.lower() for name in names}
    return [family for family in families if family.model_type.lower() in wanted]


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    families = select_families(args.names)
    if args.json:
        print(json.dumps([_as_json(family) for family in families], indent=2), file=out)
        return 0
    header = (
        "ARCHITECTURE", "INPUT", "FORMATS", "LAYERS", "PAGED KV", "PREFIX CACHE",
        "SPECULATIVE", "LORA", "TP", "PP",
    )  # fmt: skip
    print(format_table(header, [_row(family) for family in families]), file=out)
    refused = [family.model_type for family in families if not family.runs_in_engine]
    if refused:
        print(f"\nnot supported: {', '.join(refused)}: {UNSUPPORTED_CACHE}", file=out)
    return 0


def _row(family: FamilyMetadata) -> tuple[str, ...]:
    return (
        family.model_type,
        ", ".join(INPUTS[family.kind]),
        ", ".join(sorted(family.formats)),
        ", ".join(_layers(family)) if family.runs_in_engine else "not supported (see below)",
        _yes_no(family.supports_paged_kv),
        _yes_no(family.supports_prefix_caching),
        _yes_no(family.supports_speculative),
        _yes_no(family.supports_adapters),
        _yes_no(family.supports_tensor_parallel),
        _yes_no(family.supports_pipeline_parallel),
    )


def _as_json(family: FamilyMetadata) -> dict[str, object]:
    return {
        "architecture": family.model_type,
        "inputs": list(INPUTS[family.kind]),
        "formats": sorted(family.formats),
        "mlx_lm_module": family.mlx_lm_module,
        "supported": family.runs_in_engine,
        **({} if family.runs_in_engine else {"unsupported_reason": UNSUPPORTED_CACHE}),
        "layers": _layers(family),
        "paged_kv": family.supports_paged_kv,
        "prefix_caching": family.supports_prefix_caching,
        "speculative": family.supports_speculative,
        "lora": family.supports_adapters,
        "tensor_parallel": family.supports_tensor_parallel,
        "pipeline_parallel": family.supports_pipeline_parallel,
    }


# What each cache kind keeps, as the LAYERS column says it.
_KIND_NAMES = {
    CacheKind.ATTENTION: "attention",
    CacheKind.SLIDING_WINDOW: "sliding window",
    CacheKind.CHUNKED: "chunked attention",
    CacheKind.STATE: "recurrent state",
}


def _layers(family: FamilyMetadata) -> list[str]:
    """What the family's layers may keep: its cache kinds; none for a family the engine
    refuses (`UNSUPPORTED_CACHE`)."""
    if not family.runs_in_engine:
        return []
    return [_KIND_NAMES[kind] for kind in CacheKind if kind in family.cache_kinds]


def _yes_no(supported: bool) -> str:
    return "yes" if supported else "no"
