"""Loading an Idefics3 / SmolVLM folder into the family's parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel_models.compute import ComputeOptions, apply_compute_options
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.vlm_config import vlm_text_config
from mlxcel_vision.families.idefics3.config import Idefics3Config
from mlxcel_vision.families.idefics3.processor import Idefics3ImageProcessor
from mlxcel_vision.families.idefics3.vision import Idefics3VisionEncoder
from mlxcel_vision.families.idefics3.weights import (
    is_mlx_vlm_layout,
    map_module_path,
    map_weights,
)
from mlxcel_vision.family import VisionParts
from mlxcel_vision.text_decoder import MlxLmTextDecoder, make_text_model

# Names of unexpected or missing tensors quoted in a load error.
_NAMES_QUOTED = 5


class Idefics3Model(nn.Module):
    """Every weight: the vision encoder (tower and connector) and the mlx-lm text model."""

    def __init__(self, config: Idefics3Config, text_config: dict[str, Any]) -> None:
        super().__init__()
        # transformers ties the LM head by the top-level setting, not the text config's.
        text = {**text_config, "tie_word_embeddings": config.tie_word_embeddings}
        self.text_model = make_text_model(text)
        self.encoder = Idefics3VisionEncoder(config, text["hidden_size"])


def load_parts(folder: Path, config: dict[str, Any], compute: ComputeOptions) -> VisionParts:
    """Build the Idefics3 parts from a Hugging Face or mlx-vlm folder.

    Layers an mlx-vlm folder stores quantized (its config's `quantization`) are built
    quantized with the stored group size, bits and mode.

    Args:
        folder: holds config.json, *.safetensors and the processor config.
        config: the folder's config.json.
        compute: activation dtype and quantized-layer tactic, applied after the weights
            are read (they are not evaluated here).

    Raises:
        ModelLoadError: the config does not describe a supported Idefics3, a tensor is
            missing, unexpected or of the wrong shape, or the processor config is absent.
    """
    parsed = Idefics3Config.from_dict(config)
    module = Idefics3Model(parsed, vlm_text_config(config, folder))
    weights = _read_weights(folder)
    mlx_vlm = is_mlx_vlm_layout(set(weights))
    mapped = map_weights(weights, mlx_vlm=mlx_vlm, tied=parsed.tie_word_embeddings)
    if (quantization := config.get("quantization")) is not None:
        _quantize_as_stored(module, mapped, quantization, mlx_vlm=mlx_vlm)
    _load_weights(module, mapped, folder)
    apply_compute_options(module, compute)
    processor = Idefics3ImageProcessor.from_folder(
        folder,
        tile_size=parsed.vision.image_size,
        image_seq_len=parsed.image_seq_len,
        placeholder_token_id=parsed.image_token_id,
    )
    return VisionParts(processor, module.encoder, MlxLmTextDecoder(module.text_model), module)


def _read_weights(folder: Path) -> dict[str, mx.array]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors files")
    weights: dict[str, mx.array] = {}
    for file in files:
        try:
            weights.update(mx.load(str(file)))
        except (RuntimeError, ValueError) as error:
            raise ModelLoadError(f"{file}: cannot read the weights: {error}") from error
    return weights


def _quantize_as_stored(
    module: nn.Module,
    mapped: dict[str, mx.array],
    quantization: dict[str, Any],
    *,
    mlx_vlm: bool,
) -> None:
    """Make quantized the layers the folder stores quantized (mlx-vlm's `quantization`:
    default `group_size`, `bits`, `mode`, and per-layer entries by module path)."""
    per_layer = {
        map_module_path(path, mlx_vlm=mlx_vlm): setting
        for path, setting in quantization.items()
        if isinstance(setting, dict | bool)
    }

    def stored_quantized(path: str, _: nn.Module) -> bool | dict[str, Any]:
        return per_layer.get(path, f"{path}.scales" in mapped)

    try:
        nn.quantize(
            module,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            mode=quantization.get("mode", "affine"),
            class_predicate=stored_quantized,
        )
    except (KeyError, ValueError) as error:
        raise ModelLoadError(
            f"unsupported Idefics3 quantization {quantization}: {error}"
        ) from error


def _load_weights(module: nn.Module, mapped: dict[str, mx.array], folder: Path) -> None:
    expected = {name for name, _ in tree_flatten(module.parameters())}
    for problem, names in (
        ("unexpected", sorted(set(mapped) - expected)),
        ("missing", sorted(expected - set(mapped))),
    ):
        if names:
            raise ModelLoadError(
                f"{folder}: {problem} Idefics3 tensors: {', '.join(names[:_NAMES_QUOTED])}"
                + (f" and {len(names) - _NAMES_QUOTED} more" if len(names) > _NAMES_QUOTED else "")
            )
    try:
        module.load_weights(list(mapped.items()), strict=True)
    except ValueError as error:
        raise ModelLoadError(f"{folder}: {error}") from error
