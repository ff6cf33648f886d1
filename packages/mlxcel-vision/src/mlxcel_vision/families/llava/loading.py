"""Building a LLaVA or LLaVA-NeXT model's `VisionParts` from a Hugging Face or mlx-vlm
folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from mlxcel_models.compute import ComputeOptions
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.vlm_config import vlm_text_config
from mlxcel_vision.families.llava.anyres import AnyresImageEncoder, AnyresImageProcessor
from mlxcel_vision.families.llava.checkpoint import llava_weights
from mlxcel_vision.families.llava.model import LlavaArgs, LlavaImageEncoder, LlavaModel
from mlxcel_vision.families.llava.processor import LlavaImageProcessor, load_image_processor
from mlxcel_vision.family import VisionParts
from mlxcel_vision.text_decoder import MlxLmTextDecoder, make_text_model
from mlxcel_vision.weights import load_module_weights, read_safetensors

VISION_TOWERS = ("clip_vision_model",)


def load_parts(folder: Path, config: dict[str, Any], compute: ComputeOptions) -> VisionParts:
    """Load the LLaVA (`llava`) or LLaVA-NeXT (`llava_next`) model in `folder`, its weights
    not yet evaluated.

    Args:
        folder: config.json, model*.safetensors, preprocessor_config.json and the
            tokenizer.
        config: the parsed config.json.
        compute: the activation dtype and quantized-layer choices.

    Raises:
        ModelLoadError: an unsupported vision tower or text model, a config transformers
            rejects, a missing, unexpected or misshapen tensor, or an unusable processor
            config; the message names it.
    """
    settings = {key: value for key, value in config.items() if key != "model_type"}
    try:
        parsed = AutoConfig.for_model(config["model_type"], **settings).to_dict()
    except (KeyError, ValueError, TypeError) as error:
        raise ModelLoadError(f"{folder / 'config.json'}: {error}") from error
    vision_config = parsed["vision_config"]
    if vision_config.get("model_type") not in VISION_TOWERS:
        raise ModelLoadError(
            f"{folder}: unsupported LLaVA vision tower '{vision_config.get('model_type')}'; "
            f"supported: {', '.join(VISION_TOWERS)}"
        )
    text_config = vlm_text_config(config, folder)
    args = LlavaArgs.from_config(parsed, vision_config, int(text_config["hidden_size"]))
    language_model = make_text_model(text_config)
    grid_pinpoints = parsed.get("image_grid_pinpoints")
    # A tile's features must form a square map to be laid out; the class token breaks it.
    if grid_pinpoints is not None and args.select_strategy != "default":
        raise ModelLoadError(
            f"{folder}: LLaVA-NeXT needs vision_feature_select_strategy 'default', "
            f"got {args.select_strategy!r}"
        )
    model = LlavaModel(args, language_model, image_newline=grid_pinpoints is not None)
    weights = llava_weights(read_safetensors(folder), language_model, args.vision.num_channels)
    load_module_weights(model, weights, folder, compute)
    image_processor = load_image_processor(folder)
    image_token = _token_text(folder, args.image_token_id)
    decoder = MlxLmTextDecoder(language_model)
    if grid_pinpoints is None:
        processor = LlavaImageProcessor(
            image_processor,
            image_token=image_token,
            image_token_id=args.image_token_id,
            num_tokens=args.num_image_tokens,
        )
        return VisionParts(processor, LlavaImageEncoder(model, args), decoder, model)
    pinpoints = tuple((int(height), int(width)) for height, width in grid_pinpoints)
    return VisionParts(
        AnyresImageProcessor(image_processor, args, pinpoints, image_token=image_token),
        AnyresImageEncoder(model, args, pinpoints),
        decoder,
        model,
    )


def _token_text(folder: Path, token_id: int) -> str:
    """The text of an added (special) token, from the folder's tokenizer.json.

    Raises:
        ModelLoadError: tokenizer.json is missing or unreadable, or adds no such token.
    """
    path = folder / "tokenizer.json"
    try:
        added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from error
    for token in added:
        if token.get("id") == token_id:
            return token["content"]
    raise ModelLoadError(f"{path} adds no token with id {token_id}, the image token")
