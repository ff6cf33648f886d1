"""The compute-backend seam: the one place that decides which engine loads and runs models.

Every command and server obtains its models through `select_backend().load_model(...)`.
Today the answer is always MLX: `select_backend` is resolved once and cached, and the
`LoadedModel` it returns holds the mlx-lm module itself, so a forward pass dispatches
through nothing but MLX. Kinds of model that packages above mlxcel-models load (vision-language
models: mlxcel-vision) are loaded by the loader the app registers for the kind.
docs/backends.md says what another backend must provide.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Protocol

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.detection import detect_model
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.loading.gguf_quant import GGUFDequant
from mlxcel_models.loading.loader import LoadProgress, load_model
from mlxcel_models.metadata import ModelKind, find_family
from mlxcel_models.surgery import SurgeryPlan


class KindLoader(Protocol):
    """Loads the models of one kind (`ModelKind`) that mlxcel-models' loaders do not."""

    def __call__(
        self,
        path: str | Path,
        *,
        progress: LoadProgress | None = None,
        compute: ComputeOptions | None = None,
    ) -> LoadedModel:
        """Load the model at `path`, weights evaluated.

        Raises:
            ModelLoadError: the model cannot be loaded; the message is one line.
        """
        ...


class ModelBackend(Protocol):
    """Loads models into objects mlxcel-core's engine and generation loop can run."""

    name: str

    def register_kind_loader(self, kind: ModelKind, loader: KindLoader) -> None:
        """Load models of `kind` with `loader` from now on."""
        ...

    def load_model(
        self,
        path: str | Path,
        *,
        progress: LoadProgress | None = None,
        compute: ComputeOptions | None = None,
        surgery: SurgeryPlan | None = None,
        gguf_dequant: GGUFDequant = GGUFDequant.AUTO,
    ) -> LoadedModel:
        """Load a GGUF file or a model folder, weights evaluated and `surgery` applied;
        `gguf_dequant` says how a GGUF file's quantized tensors load.

        Raises:
            ModelLoadError: the model cannot be loaded (`SurgeryError` for surgery that
                does not fit it); the message is one line.
        """
        ...


class MlxBackend:
    """MLX on the default device: mlxcel's loaders and mlx-lm's model classes."""

    name = "mlx"

    def __init__(self) -> None:
        self._kind_loaders: dict[ModelKind, KindLoader] = {}

    def register_kind_loader(self, kind: ModelKind, loader: KindLoader) -> None:
        self._kind_loaders[kind] = loader

    def load_model(
        self,
        path: str | Path,
        *,
        progress: LoadProgress | None = None,
        compute: ComputeOptions | None = None,
        surgery: SurgeryPlan | None = None,
        gguf_dequant: GGUFDequant = GGUFDequant.AUTO,
    ) -> LoadedModel:
        family = find_family(detect_model(path).model_type)
        kind_loader = None if family is None else self._kind_loaders.get(family.kind)
        if kind_loader is None:
            return load_model(
                path,
                progress=progress,
                compute=compute,
                surgery=surgery,
                gguf_dequant=gguf_dequant,
            )
        if surgery is not None:
            raise ModelLoadError(f"{path}: surgery does not apply to {family.kind.value} models")
        return kind_loader(path, progress=progress, compute=compute)


@functools.cache
def select_backend() -> ModelBackend:
    """The backend of this process, chosen on the first call and the same afterwards."""
    return MlxBackend()
