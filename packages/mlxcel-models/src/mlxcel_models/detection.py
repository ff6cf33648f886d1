"""Which model a path holds: its weight format and model type."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architectures import gguf_model_type
from mlxcel_models.loading.gguf_file import GGUF_MAGIC, read_gguf_header
from mlxcel_models.metadata import WeightFormat

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class ModelSource:
    """A model on disk.

    Attributes:
        path: the GGUF file or the model folder.
        weight_format: GGUF or safetensors.
        model_type: `model_type` from config.json; for a GGUF file, the mlx-lm
            `model_type` its `general.architecture` maps to (`gguf_model_type`), or the
            architecture itself when mlxcel does not map it.
    """

    path: Path
    weight_format: WeightFormat
    model_type: str

    @property
    def config_file(self) -> Path:
        """Where the model's config is read from: config.json, or the GGUF file's metadata."""
        if self.weight_format is WeightFormat.GGUF:
            return self.path
        return self.path / CONFIG_FILE


def is_gguf_file(path: Path) -> bool:
    """True if `path` is a file that starts with the GGUF magic bytes."""
    if not path.is_file():
        return False
    with path.open("rb") as file:
        return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def read_config(folder: Path) -> dict[str, Any]:
    """Parse a model folder's config.json.

    Raises:
        ModelLoadError: the file is missing or not a JSON object.
    """
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise ModelLoadError(f"{folder} has no {CONFIG_FILE}; is it a model folder?")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot parse {config_path}: {error}") from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path} does not hold a JSON object")
    return config


def model_type_from_config(config: dict[str, Any], where: Path) -> str:
    """The model type a config.json declares (`model_type`, else a `text_config`'s).

    Raises:
        ModelLoadError: no model type is declared.
    """
    model_type = config.get("model_type")
    if model_type is None or model_type == "":
        raise ModelLoadError(f"{where / CONFIG_FILE} declares no model_type")
    if not isinstance(model_type, str):
        raise ModelLoadError(
            f"{where / CONFIG_FILE}: 'model_type' must be a string, got {model_type!r}"
        )
    return model_type


def detect_model(path: str | Path) -> ModelSource:
    """Find the weight format and model type of a GGUF file or a model folder.

    Raises:
        ModelLoadError: the path does not exist, or is neither GGUF nor a model folder.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model not found: {path}")
    if path.is_dir():
        if not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{path} holds no .safetensors weights")
        config = read_config(path)
        return ModelSource(path, WeightFormat.SAFETENSORS, model_type_from_config(config, path))
    if not is_gguf_file(path):
        raise ModelLoadError(f"{path} is neither a GGUF file nor a model folder")
    header = read_gguf_header(path)
    architecture = header.metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ModelLoadError(f"{path} has no general.architecture in its GGUF metadata")
    return ModelSource(path, WeightFormat.GGUF, gguf_model_type(architecture, header.metadata))
