"""`mlxcel serve`'s web page flags, llama-server's: `--no-webui` turns the chat page at `/`
off, `--path DIR` serves another folder there in its place."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlxcel.common.flags import Flag, UsageError
from mlxcel_core.errors import InputError

WEBUI_FLAGS = (
    Flag(("--no-webui",), "no_webui", bool, False,
         "serve no chat page at / (then / is 404)", is_switch=True),
    Flag(("--path",), "static_path", str, None,
         "a folder of static files served at / in place of the built-in chat page",
         env="LLAMA_ARG_STATIC_PATH"),
)  # fmt: skip


def static_path_from(args: argparse.Namespace) -> Path | None:
    """The folder `--path` names, or None for the built-in page.

    Raises:
        UsageError: `--path` is given with `--no-webui`.
        InputError: the folder does not exist or is not a folder.
    """
    if args.static_path is None:
        return None
    if args.no_webui:
        raise UsageError("--no-webui serves no page, but --path names a folder to serve")
    path = Path(args.static_path).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"--path: {args.static_path} is not a folder")
    if not path.is_dir():
        raise InputError(f"--path: no such folder: {args.static_path}")
    return path
