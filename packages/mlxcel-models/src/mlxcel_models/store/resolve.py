"""From a model argument to the local path to load: local paths, the store, the Hugging
Face cache, then a download."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.store.config import StoreConfig
from mlxcel_models.store.download import download_model
from mlxcel_models.store.layout import FOLDER, model_folder, read_manifest, request_key
from mlxcel_models.store.reference import ModelReference, parse_model_reference
from mlxcel_models.store.selection import select_files

DEFAULT_REVISION = "main"
SHARD_INDEX = "model.safetensors.index.json"


def resolve_model(text: str, config: StoreConfig, *, revision: str | None = None) -> Path:
    """The local path `load_model` should open for the model argument `text`.

    A local path is returned as it is (a missing one fails when it is loaded). A Hub id is
    looked up in the store, then in the Hugging Face cache, and downloaded into the store
    when neither holds it; a model found locally costs no request.

    Args:
        text: a path, `owner/name`, a bare `name` (under `config.default_org`), either with
            an optional `:QUANT` GGUF tag.
        config: the store and Hub settings.
        revision: the branch, tag or commit of a Hub id (default `main`).

    Raises:
        ValueError: a revision is given for a local path.
        ModelLoadError: the id cannot be found or fetched (offline and absent, unknown on
            the Hub, no fitting file, network failure); the message names it.
    """
    reference = parse_model_reference(text, config.default_org)
    if reference is None:
        if revision is not None:
            raise ValueError(f"revision {revision!r} given for the local path {text}")
        return Path(text).expanduser()
    revision = revision or DEFAULT_REVISION
    found = find_in_store(reference, revision, config) or find_in_hf_cache(
        reference, revision, config
    )
    if found is not None:
        return found
    if config.offline:
        at_revision = "" if revision == DEFAULT_REVISION else f" at revision {revision!r}"
        raise ModelLoadError(
            f"{reference}{at_revision} is neither in the model store ({config.models_dir}) nor "
            "in the Hugging Face cache, and offline mode (HF_HUB_OFFLINE) forbids downloading it"
        )
    return download_model(reference, revision, config)


def find_in_store(reference: ModelReference, revision: str, config: StoreConfig) -> Path | None:
    """The path to load from a complete store download of `reference` at `revision`."""
    folder = model_folder(config.models_dir, reference.repo_id)
    manifest = read_manifest(folder)
    if manifest is None or not manifest.matches(revision):
        return None
    load = manifest.loads.get(request_key(reference))
    if load is None or not all((folder / name).is_file() for name in manifest.files):
        return None
    return folder if load == FOLDER else folder / load


def find_in_hf_cache(reference: ModelReference, revision: str, config: StoreConfig) -> Path | None:
    """The path to load from the Hugging Face cache's snapshot of `reference` at
    `revision`, when it holds the model's files.

    The cache's layout is huggingface_hub's: `models--owner--name/refs/<branch>` names a
    commit, `snapshots/<commit>/` holds links to the files downloaded at it.
    """
    repo_folder = config.hf_cache_dir / repo_folder_name(
        repo_id=reference.repo_id, repo_type="model"
    )
    commit = revision
    if not REGEX_COMMIT_HASH.fullmatch(revision):
        try:
            commit = (repo_folder / "refs" / revision).read_text(encoding="utf-8").strip()
        except OSError:
            return None
    snapshot = repo_folder / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    files = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]
    return _model_path(reference, snapshot, files)


def _model_path(reference: ModelReference, folder: Path, files: Iterable[str]) -> Path | None:
    try:
        selection = select_files(reference, files)
    except ModelLoadError:
        return None
    if not all((folder / name).is_file() for name in selection.files):
        return None
    if selection.gguf_file is not None:
        return folder / selection.gguf_file
    return folder if _has_every_shard(folder) else None


def _has_every_shard(folder: Path) -> bool:
    """False when the safetensors index names a shard the folder lacks."""
    try:
        index = json.loads((folder / SHARD_INDEX).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return False
    return all((folder / str(shard)).is_file() for shard in set(weight_map.values()))
