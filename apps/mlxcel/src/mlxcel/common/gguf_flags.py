"""`--gguf-dequant {auto,bf16}` (`MLXCEL_GGUF_DEQUANT`): how a GGUF file's quantized
tensors load, shared by `generate`, `run`, `serve` and `bench`. It applies to the model `-m`
names, not to a draft model."""

from __future__ import annotations

from mlxcel.common.flags import Flag
from mlxcel_models.backend import GGUFDequant


def _dequant_mode(text: str) -> GGUFDequant:
    try:
        return GGUFDequant(text.strip().lower())
    except ValueError:
        choices = ", ".join(mode.value for mode in GGUFDequant)
        raise ValueError(f"expected one of {choices}") from None


GGUF_DEQUANT_FLAG = Flag(
    ("--gguf-dequant",),
    "gguf_dequant",
    _dequant_mode,
    GGUFDequant.AUTO,
    "how a GGUF file's quantized tensors load: auto = MLX quantization at the nearest bit "
    "width (K- and I-quants included), bf16 = dequantized to bfloat16; see docs/models.md",
    env="MLXCEL_GGUF_DEQUANT",
)
