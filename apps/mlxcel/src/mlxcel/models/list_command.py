"""`mlxcel list`: the built-in default model and the models in the store, with their size
and last modification."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from mlxcel.common.flags import Flag, UsageError, add_command, resolve_defaults
from mlxcel.common.tables import format_size, format_table
from mlxcel.models.store_flags import MODELS_DIR_FLAG, store_config_from
from mlxcel_core.errors import InputError
from mlxcel_models.default_model import default_model_path
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.store import StoredModel, list_stored_models

FLAGS = (
    MODELS_DIR_FLAG,
    Flag(("--json",), "json", bool, False, "print a JSON array of the models",
         env="MLXCEL_JSON", is_switch=True),
    Flag(("-q", "--quiet"), "quiet", bool, False, "print only the model ids, one a line",
         env="MLXCEL_QUIET", is_switch=True),
)  # fmt: skip
INCOMPLETE_MARK = " (incomplete)"
BUILT_IN_MARK = " (built in)"


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
    built_in = _built_in_model()
    if args.json:
        listed = [_as_json(model) for model in models]
        if built_in is not None:
            listed.insert(0, _built_in_json(built_in))
        print(json.dumps(listed, indent=2), file=out)
    elif args.quiet:
        for model in models:
            print(model.repo_id, file=out)
    else:
        rows = [_row(model) for model in models]
        if built_in is not None:
            rows.insert(0, _built_in_row(built_in))
        if rows:
            print(format_table(("NAME", "SIZE", "MODIFIED"), rows), file=out)
        if not models:
            print(f"mlxcel: no models in the store {models_dir}", file=err)
    return 0


def _built_in_model() -> Path | None:
    """The embedded default model's file (used when no -m is given), None if not installed."""
    try:
        path = default_model_path()
    except ModelLoadError:
        return None
    return path if path.is_file() else None


def _modified(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)


def _built_in_row(path: Path) -> tuple[str, str, str]:
    modified = _modified(path).astimezone().strftime("%Y-%m-%d %H:%M")
    return path.name + BUILT_IN_MARK, format_size(path.stat().st_size), modified


def _built_in_json(path: Path) -> dict[str, object]:
    return {
        "id": path.name,
        "path": str(path),
        "size_bytes": path.stat().st_size,
        "modified": _modified(path).isoformat(),
        "complete": True,
        "built_in": True,
    }


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
        "built_in": False,
    }
