"""Downloading a model into the store with huggingface_hub.

Files go straight to `models_dir/owner/name` (huggingface_hub's `local_dir` mode), with
huggingface_hub's progress bars on stderr. A transfer that breaks off mid-file is resumed
with an HTTP Range request; after a failed run, the files that did arrive are kept and a
new run fetches only the others.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.store.config import StoreConfig
from mlxcel_models.store.layout import (
    FOLDER,
    Manifest,
    model_folder,
    read_manifest,
    request_key,
    write_manifest,
)
from mlxcel_models.store.reference import ModelReference
from mlxcel_models.store.selection import select_files


def download_model(reference: ModelReference, revision: str, config: StoreConfig) -> Path:
    """Fetch the files of `reference` at `revision` into the store.

    The store holds one revision of a model: a folder downloaded at another commit is
    emptied first.

    Returns:
        The model folder, or the GGUF file in it, ready for `load_model`.

    Raises:
        ModelLoadError: the repository, revision or a fitting file does not exist, the Hub
            cannot be reached or answers with an error, or the files cannot be written;
            the message names the model.
    """
    api = HfApi(endpoint=config.endpoint, token=config.token or False)
    folder = model_folder(config.models_dir, reference.repo_id)
    try:
        info = api.model_info(reference.repo_id, revision=revision)
        commit = info.sha or revision
        selection = select_files(reference, (s.rfilename for s in info.siblings or ()))
        manifest = read_manifest(folder)
        if manifest is not None and manifest.commit != commit:
            shutil.rmtree(folder)
            manifest = None
        folder.mkdir(parents=True, exist_ok=True)
        snapshot_download(
            reference.repo_id,
            revision=commit,
            local_dir=folder,
            cache_dir=config.hf_cache_dir,
            allow_patterns=list(selection.files),
            endpoint=config.endpoint,
            token=config.token or False,
        )
        files = tuple(sorted({*(manifest.files if manifest else ()), *selection.files}))
        loads = {
            **(manifest.loads if manifest else {}),
            request_key(reference): selection.gguf_file or FOLDER,
        }
        write_manifest(folder, Manifest(reference.repo_id, revision, commit, files, loads))
    except GatedRepoError as error:
        raise ModelLoadError(
            f"{reference} is gated: accept its terms on the Hub and set HF_TOKEN"
        ) from error
    except RepositoryNotFoundError as error:
        raise ModelLoadError(
            f"no model {reference.repo_id} on {config.endpoint} (a private one needs HF_TOKEN)"
        ) from error
    except RevisionNotFoundError as error:
        raise ModelLoadError(f"{reference.repo_id} has no revision {revision!r}") from error
    except HfHubHTTPError as error:
        status = error.response.status_code
        raise ModelLoadError(f"cannot download {reference}: the Hub answered {status}") from error
    except HTTPError as error:
        raise ModelLoadError(
            f"cannot download {reference}: {config.endpoint} cannot be reached ({error})"
        ) from error
    except OSError as error:
        raise ModelLoadError(f"cannot download {reference} into {folder}: {error}") from error
    return folder if selection.gguf_file is None else folder / selection.gguf_file
