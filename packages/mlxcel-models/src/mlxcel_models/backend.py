"""The compute-backend seam: the one place that decides which engine loads and runs models.

Every command and server obtains its models through `select_backend().load_model(...)`.
Today the answer is always MLX: `select_backend` is resolved once and cached, and the
`LoadedModel` it returns holds the mlx-lm module itself, so a forward pass dispatches
through nothing but MLX. docs/backends.md says what another backend must provide.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Protocol

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.loading.loader import LoadProgress, load_model
from mlxcel_models.surgery import SurgeryPlan


class ModelBackend(Protocol):
    """Loads models into objects mlxcel-core's engine and generation loop can run."""

    name: str

    def load_model(
        self,
        path: str | Path,
        *,
        progress: LoadProgress | None = None,
        compute: ComputeOptions | None = None,
        surgery: SurgeryPlan | None = None,
    ) -> LoadedModel:
        """Load a GGUF file or a model folder, weights evaluated and `surgery` applied.

        Raises:
            ModelLoadError: the model cannot be loaded (`SurgeryError` for surgery that
                does not fit it); the message is one line.
        """
        ...


class MlxBackend:
    """MLX on the default device: mlxcel's loaders and mlx-lm's model classes."""

    name = "mlx"

    def load_model(
        self,
        path: str | Path,
        *,
        progress: LoadProgress | None = None,
        compute: ComputeOptions | None = None,
        surgery: SurgeryPlan | None = None,
    ) -> LoadedModel:
        return load_model(path, progress=progress, compute=compute, surgery=surgery)


@functools.cache
def select_backend() -> ModelBackend:
    """The backend of this process, chosen on the first call and the same afterwards."""
    return MlxBackend()
