"""Loading the model a command names, with a progress bar for slow loads."""

from __future__ import annotations

import sys

from tqdm import tqdm

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.loading.loader import load_model

PROGRESS_DELAY_SECONDS = 1.0


def load_for_command(model: str | None, *, compute: ComputeOptions | None = None) -> LoadedModel:
    """Load `model` (or the default model), showing progress on stderr after a second.

    `compute` is passed to `load_model` (None: the best for the device).

    Raises:
        ModelLoadError: as `load_model` does.
    """
    path = default_model_path() if model is None else model
    with tqdm(
        desc="loading", unit="layer", delay=PROGRESS_DELAY_SECONDS, file=sys.stderr, leave=False
    ) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        return load_model(path, progress=progress, compute=compute)
