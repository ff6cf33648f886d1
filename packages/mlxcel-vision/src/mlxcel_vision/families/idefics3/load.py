"""Loading an Idefics3 / SmolVLM folder into the family's parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.nn as nn

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.vlm_config import vlm_text_config
from mlxcel_vision.families.idefics3.config import Idefics3Config
from mlxcel_vision.families.idefics3.processor import Idefics3ImageProcessor
from mlxcel_vision.families.idefics3.vision import Idefics3VisionEncoder
from mlxcel_vision.families.idefics3.weights import map_weights
from mlxcel_vision.family import VisionParts
from mlxcel_vision.text_decoder import MlxLmTextDecoder, make_text_model
from mlxcel_vision.weights import load_module_weights, read_safetensors


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

    Layers an mlx-vlm folder stores quantized are built quantized with the group size and
    bits their tensors were packed with.

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
    weights = map_weights(read_safetensors(folder), tied=parsed.tie_word_embeddings)
    load_module_weights(module, weights, folder, compute)
    processor = Idefics3ImageProcessor.from_folder(
        folder,
        tile_size=parsed.vision.image_size,
        image_seq_len=parsed.image_seq_len,
        placeholder_token_id=parsed.image_token_id,
    )
    return VisionParts(processor, module.encoder, MlxLmTextDecoder(module.text_model), module)
