"""The model store's flags and environment variables, for the commands that load or
manage models.

`--models-dir` (`MLXCEL_MODELS_DIR`) places the store, by default
`${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}/models`; `--revision` (`MLXCEL_REVISION`) picks the
branch, tag or commit of a Hugging Face `-m` id. huggingface_hub's own variables are read
here too, from the command's environment: `HF_ENDPOINT`, `HF_HOME` / `HF_HUB_CACHE`,
`HF_TOKEN` and `HF_HUB_OFFLINE`; `MLXCEL_DEFAULT_ORG` is the organisation of a bare name.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from mlxcel.common.flags import Flag, UsageError
from mlxcel_models.store import DEFAULT_ORG, StoreConfig, parse_model_reference
from mlxcel_models.store.config import DEFAULT_ENDPOINT

MODELS_DIR_FLAG = Flag(
    ("--models-dir",),
    "models_dir",
    str,
    None,
    "the store of downloaded models (default: $MLXCEL_CACHE_DIR/models, ~/.cache/mlxcel/models)",
    env="MLXCEL_MODELS_DIR",
)
REVISION_FLAG = Flag(
    ("--revision",),
    "revision",
    str,
    None,
    "branch, tag or commit of a Hugging Face id given with -m (default: main)",
    env="MLXCEL_REVISION",
)
STORE_FLAGS = (MODELS_DIR_FLAG, REVISION_FLAG)

_TRUE = ("1", "true", "yes", "on")


def store_config_from(models_dir: str | None, environ: Mapping[str, str]) -> StoreConfig:
    """The store's settings from `--models-dir` (None: the default) and `environ`.

    Raises:
        UsageError: `MLXCEL_DEFAULT_ORG` is not one organisation name.
    """
    mlxcel_cache = Path(environ.get("MLXCEL_CACHE_DIR") or "~/.cache/mlxcel").expanduser()
    # huggingface_hub's own defaults (huggingface_hub.constants).
    cache_home = Path(environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    hf_home = Path(environ.get("HF_HOME") or cache_home / "huggingface").expanduser()
    try:
        return StoreConfig(
            models_dir=Path(models_dir or mlxcel_cache / "models").expanduser(),
            hf_cache_dir=Path(environ.get("HF_HUB_CACHE") or hf_home / "hub").expanduser(),
            endpoint=(environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            token=environ.get("HF_TOKEN") or _stored_token(hf_home),
            offline=environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE,
            default_org=environ.get("MLXCEL_DEFAULT_ORG", DEFAULT_ORG),
        )
    except ValueError as error:
        raise UsageError(f"MLXCEL_DEFAULT_ORG: {error}") from error


def resolve_store_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Set `args.model_store` (a `StoreConfig`) from resolved `STORE_FLAGS` and `environ`.

    Raises:
        UsageError: `--revision` is given without a Hugging Face id in `-m`.
    """
    args.model_store = store_config_from(args.models_dir, environ)
    if args.revision is not None and (
        args.model is None
        or parse_model_reference(args.model, args.model_store.default_org) is None
    ):
        model = "the default model" if args.model is None else f"the local path {args.model}"
        raise UsageError(f"--revision applies to a Hugging Face id given with -m, not to {model}")


def _stored_token(hf_home: Path) -> str | None:
    """The token `hf auth login` saved under `hf_home`, if any."""
    try:
        return (hf_home / "token").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
