"""`mlxcel list`: the models in the store, with their size and last modification."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import TextIO

from mlxcel.flags import Flag, InputError, UsageError, add_command, resolve_defaults
from mlxcel.store_flags import MODELS_DIR_FLAG, store_config_from
from mlxcel.tables import format_size, format_table
from mlxcel_models.store import StoredModel, list_stored_models

FLAGS = (
    MODELS_DIR_FLAG,
    Flag(("--json",), "json", bool, False, "print a JSON array of the models",
         env="MLXCEL_JSON", is_switch=True),
    Flag(("-q", "--quiet"), "quiet", bool, False, "print only the model ids, one a line",
         env="MLXCEL_QUIET", is_switch=True),
)  # fmt: skip
INCOMPLETE_MARK = " (incomplete)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    add_command(subparsers, "list", __doc__, FLAGS, run)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    resolve_defaults(args, FLAGS, environ)
    if args.json and args.quiet:
        raise UsageError("--json and -q/--quiet are two output formats: pick one")
    models_dir = store_config_from(args.models_dir, environ).models_dir
    if models_dir.exists() and not models_dir.is_dir():
        raise InputError(f"the model store {models_dir} is a file, not a folder")
    models = list_stored_models(models_dir)
    if args.json:
        print(json.dumps([_as_json(model) for model in models], indent=2), file=out)
    elif args.quiet:
        for model in models:
            print(model.repo_id, file=out)
    elif not models:
        print(f"mlxcel: no models in the store {models_dir}", file=err)
    else:
        print(format_table(("NAME", "SIZE", "MODIFIED"), [_row(m) for m in models]), file=out)
    return 0


def _row(model: StoredModel) -> tuple[str, str, str]:
    name = model.repo_id + ("" if model.complete else INCOMPLETE_MARK)
    modified = model.modified.astimezone().strftime("%Y-%m-%d %H:%M")
    return name, format_size(model.size_bytes), modified


def _as_json(model: StoredModel) -> dict[str, object]:
    return {
        "id": model.repo_id,
        "path": str(model.path),
        "size_bytes": model.size_bytes,
        "modified": model.modified.isoformat(),
        "complete": model.complete,
    }
