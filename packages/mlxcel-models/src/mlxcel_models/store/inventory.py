"""What the store holds, and removing a model from it."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mlxcel_core.errors import InputError
from mlxcel_models.store.layout import model_folder, read_manifest


class StoreError(InputError):
    """A store operation cannot be done; the message says why in one line."""


@dataclass(frozen=True)
class StoredModel:
    """One model folder in the store.

    Attributes:
        repo_id: `owner/name`.
        path: its folder.
        size_bytes: bytes of every file in it.
        modified: the latest modification time of its files (UTC).
        complete: its download finished (a manifest lists its files).
    """

    repo_id: str
    path: Path
    size_bytes: int
    modified: datetime
    complete: bool


def list_stored_models(models_dir: Path) -> list[StoredModel]:
    """The models in `models_dir`, sorted by id; empty when the store does not exist."""
    if not models_dir.is_dir():
        return []
    return [
        describe_stored_model(folder)
        for owner in sorted(models_dir.iterdir())
        if owner.is_dir() and not owner.is_symlink()
        for folder in sorted(owner.iterdir())
        if folder.is_dir() and not folder.is_symlink()
    ]


def describe_stored_model(folder: Path) -> StoredModel:
    """Size, last modification and completeness of the store folder `owner/name`."""
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    stats = [p.stat() for p in files]
    latest = max((s.st_mtime for s in stats), default=folder.stat().st_mtime)
    return StoredModel(
        repo_id=f"{folder.parent.name}/{folder.name}",
        path=folder,
        size_bytes=sum(s.st_size for s in stats),
        modified=datetime.fromtimestamp(latest, UTC),
        complete=read_manifest(folder) is not None,
    )


def find_stored_model(models_dir: Path, repo_id: str) -> StoredModel:
    """The store's folder of `repo_id`, checked to lie inside the store.

    Raises:
        StoreError: the store does not hold it, or its folder (or a link on the way to it)
            leads outside `models_dir/owner/name`.
    """
    folder = model_folder(models_dir, repo_id)
    if not folder.exists() and not folder.is_symlink():
        raise StoreError(f"{repo_id} is not in the model store ({models_dir})")
    expected = model_folder(models_dir.resolve(), repo_id)
    if folder.is_symlink() or folder.resolve() != expected or not expected.is_dir():
        raise StoreError(
            f"refusing to touch {folder}: it resolves to {folder.resolve()}, not to a folder "
            f"of the model store {models_dir.resolve()}"
        )
    return describe_stored_model(expected)


def remove_stored_model(model: StoredModel) -> None:
    """Delete a model folder `find_stored_model` returned, and its owner's folder once
    empty.

    Raises:
        StoreError: the files cannot be deleted.
    """
    try:
        shutil.rmtree(model.path)
    except OSError as error:
        raise StoreError(f"cannot delete {model.path}: {error.strerror or error}") from error
    with contextlib.suppress(OSError):  # the owner still has other models
        model.path.parent.rmdir()
