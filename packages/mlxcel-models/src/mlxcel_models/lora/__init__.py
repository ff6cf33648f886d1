"""LoRA adapters: mlx-lm and PEFT folders, unfused with per-request scales or fused."""

from mlxcel_models.lora.adapters import (
    AdapterInfo,
    AdapterScaleError,
    AdapterSpec,
    LoraAdapters,
    apply_adapters,
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
    "apply_adapters",
    "read_adapter",
]
