"""LoRA adapters: mlx-lm and PEFT folders, unfused with per-request scales or fused
(attached to a loaded model by `mlxcel_models.attach_lora.apply_adapters`)."""

from mlxcel_models.lora.adapters import (
    AdapterInfo,
    AdapterScaleError,
    AdapterSpec,
    LoraAdapters,
)
from mlxcel_models.lora.errors import AdapterLoadError
from mlxcel_models.lora.formats import AdapterFormat, read_adapter

__all__ = [
    "AdapterFormat",
    "AdapterInfo",
    "AdapterLoadError",
    "AdapterScaleError",
    "AdapterSpec",
    "LoraAdapters",
    "read_adapter",
]
