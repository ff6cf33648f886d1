"""The store on disk: `models_dir/owner/name`, and the manifest of what was downloaded.

A download writes `.mlxcel-manifest.json` into the model's folder only once every file
has arrived, so a folder with a manifest holds those files whole; huggingface_hub's own
bookkeeping sits beside it in `.cache/huggingface/`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from mlxcel_models.store.reference import ModelReference

MANIFEST_FILE = ".mlxcel-manifest.json"
FOLDER = "."


@dataclass(frozen=True)
class Manifest:
    """What a store folder holds.

    Attributes:
        repo_id: `owner/name`.
        revision: the revision asked for (a branch, tag or commit).
        commit: the commit it resolved to.
        files: repository paths downloaded, all present.
        loads: what to load for each request made, by its GGUF tag in upper case ("" for
            none): a GGUF file's repository path, or "." for the folder.
    """

    repo_id: str
    revision: str
    commit: str
    files: tuple[str, ...]
    loads: dict[str, str]

    def matches(self, revision: str) -> bool:
        return revision in (self.revision, self.commit)


def request_key(reference: ModelReference) -> str:
    """The key of `reference`'s request in `Manifest.loads`."""
    return (reference.quant or "").upper()


def model_folder(models_dir: Path, repo_id: str) -> Path:
    """The store folder of `owner/name`."""
    owner, name = repo_id.split("/")
    return models_dir / owner / name


def read_manifest(folder: Path) -> Manifest | None:
    """The manifest of a store folder; None if there is none or it cannot be read."""
    try:
        data = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        return Manifest(
            data["repo_id"],
            data["revision"],
            data["commit"],
            tuple(data["files"]),
            dict(data["loads"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Record `manifest` in `folder`, written whole or not at all."""
    partial = folder / (MANIFEST_FILE + ".partial")
    partial.write_text(json.dumps(asdict(manifest), indent=1), encoding="utf-8")
    partial.replace(folder / MANIFEST_FILE)
