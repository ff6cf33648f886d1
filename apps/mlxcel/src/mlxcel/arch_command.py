"""`mlxcel arch`: the model architectures mlxcel loads, and what each supports.

Read from the models package's family metadata (`mlxcel_models.metadata.all_families`):
the text families are mlx-lm's, each with the caches its layers keep and what the engine
does with them: no prefix caching, speculative decoding or pipeline stages with recurrent
state; a cache class of the family's own is named, and its load is refused with the
reason.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TextIO

from mlxcel.flags import Flag, add_command, resolve_defaults
from mlxcel.tables import format_table
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


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "arch", __doc__, FLAGS, run)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    families = list(all_families().values())
    if args.json:
        print(json.dumps([_as_json(family) for family in families], indent=2), file=out)
        return 0
    header = (
        "ARCHITECTURE", "INPUT", "FORMATS", "LAYERS", "PAGED KV", "PREFIX CACHE",
        "SPECULATIVE", "LORA", "TP", "PP",
    )  # fmt: skip
    print(format_table(header, [_row(family) for family in families]), file=out)
    return 0


def _row(family: FamilyMetadata) -> tuple[str, ...]:
    return (
        family.model_type,
        ", ".join(INPUTS[family.kind]),
        ", ".join(sorted(family.formats)),
        ", ".join(_layers(family)),
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
    """What the family's layers may keep: its cache kinds, then any cache class of its
    own (which the engine has no kind for)."""
    kinds = [_KIND_NAMES[kind] for kind in CacheKind if kind in family.cache_kinds]
    return kinds + [f"{name} (own class)" for name in sorted(family.unknown_caches)]


def _yes_no(supported: bool) -> str:
    return "yes" if supported else "no"
