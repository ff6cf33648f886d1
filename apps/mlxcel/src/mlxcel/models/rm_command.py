"""`mlxcel rm ID`: delete a model from the store, after asking.

Without `--yes`, the question is asked on the terminal; with no terminal on stdin the
command refuses rather than guess. Only a folder `owner/name` of the store is deleted:
an id whose folder (or a link on the way to it) leads elsewhere is refused.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TextIO

from mlxcel.common.flags import Flag, add_flags, resolve_defaults
from mlxcel.common.tables import format_size
from mlxcel.models.store_flags import MODELS_DIR_FLAG, store_config_from
from mlxcel_core.errors import InputError
from mlxcel_models.store import (
    StoredModel,
    StoreError,
    find_stored_model,
    parse_hub_id,
    remove_stored_model,
)

FLAGS = (
    MODELS_DIR_FLAG,
    Flag(("-y", "--yes"), "yes", bool, False, "delete without asking", env="MLXCEL_YES",
         is_switch=True),
)  # fmt: skip
EXIT_KEPT = 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rm", description=__doc__)
    parser.add_argument("model", metavar="ID", help="the model, as `mlxcel list` names it")
    add_flags(parser, FLAGS)
    parser.set_defaults(command=run)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """Delete the model; exit 1 when the answer to the question is not yes.

    Raises:
        InputError: the id is not in the store or leads outside it, stdin is no terminal
            and `--yes` is not given, or the files cannot be deleted.
    """
    resolve_defaults(args, FLAGS, environ)
    store = store_config_from(args.models_dir, environ)
    reference = parse_hub_id(args.model, store.default_org)
    if reference is None:
        raise InputError(f"{args.model} is not a model id (owner/name); see `mlxcel list`")
    if reference.quant is not None:
        raise InputError(f"rm deletes a whole model: give {reference.repo_id}, without a tag")
    try:
        model = find_stored_model(store.models_dir, reference.repo_id)
        if not args.yes and not _confirmed(model, err):
            print(f"mlxcel: kept {model.repo_id}", file=err)
            return EXIT_KEPT
        remove_stored_model(model)
    except StoreError as error:
        raise InputError(str(error)) from error
    print(f"deleted {model.repo_id} ({format_size(model.size_bytes)})", file=out)
    return 0


def _confirmed(model: StoredModel, err: TextIO) -> bool:
    if not sys.stdin.isatty():
        raise InputError(
            f"not deleting {model.repo_id}: stdin is not a terminal to ask on; pass --yes"
        )
    print(
        f"delete {model.repo_id} ({format_size(model.size_bytes)}, {model.path})? [y/N] ",
        end="",
        file=err,
        flush=True,
    )
    return sys.stdin.readline().strip().lower() in ("y", "yes")
