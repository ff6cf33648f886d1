"""`load_vision_model`: a vision-language folder to a `LoadedModel`, by model type."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel_models.backend import LoadProgress
from mlxcel_models.compute import ComputeOptions, has_quantized_layers
from mlxcel_models.detection import detect_model, read_config
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loaded import LoadedModel, ModelConfig
from mlxcel_models.metadata import ModelKind, family_for
from mlxcel_models.mlx_lm_models import count_parameters
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_models.vlm_config import vlm_text_config
from mlxcel_vision.families import idefics3, llava, qwen2_vl
from mlxcel_vision.family import VisionParts
from mlxcel_vision.model import VisionLanguageModel
from mlxcel_vision.prompter import VisionPrompter

FamilyLoader = Callable[[Path, dict[str, Any], ComputeOptions], VisionParts]
"""A family's `load_parts(folder, config, compute)`."""

VISION_FAMILIES: dict[str, FamilyLoader] = {
    "llava": llava.load_parts,
    "llava_next": llava.load_parts,
    "qwen2_vl": qwen2_vl.load_parts,
    "qwen2_5_vl": qwen2_vl.load_parts,
    "idefics3": idefics3.load_parts,
    "smolvlm": idefics3.load_parts,
}
"""The loader of each vision-language `model_type`."""


def load_vision_model(
    path: str | Path,
    *,
    progress: LoadProgress | None = None,
    compute: ComputeOptions | None = None,
) -> LoadedModel:
    """Load a vision-language model folder (Hugging Face or mlx-vlm layout).

    Args:
        path: a folder with config.json, model*.safetensors, preprocessor_config.json and
            tokenizer files.
        progress: called with (layers evaluated, total) while the weights are read; each
            numbered layer of the vision tower and the text model counts, and the rest of
            the weights as one.
        compute: activation dtype and quantized-layer choices; None picks the measured
            best for the default device (`ComputeOptions.for_device`).

    Returns:
        A `LoadedModel` whose `model` is a `VisionLanguageModel` and whose
        `image_prompter` turns chat text and images into prompts.

    Raises:
        ModelLoadError: the path holds no vision-language model mlxcel-vision supports, or
            its files are missing, inconsistent or unreadable; the message is one line.
    """
    start = time.perf_counter()
    source = detect_model(path)
    family = family_for(source.model_type, source.weight_format)
    load_parts = VISION_FAMILIES.get(source.model_type)
    if family.kind is not ModelKind.VLM or load_parts is None:
        raise ModelLoadError(
            f"{source.path}: '{source.model_type}' is not a vision-language model type "
            f"mlxcel-vision loads; supported: {', '.join(sorted(VISION_FAMILIES))}"
        )
    config = read_config(source.path)
    text_config = vlm_text_config(config, source.path)
    options = compute or ComputeOptions.for_device(mx.default_device())
    parts = load_parts(source.path, config, options)
    tokenizer = Tokenizer.from_folder(source.path)
    try:
        _evaluate_weights(parts.module, progress)
    except RuntimeError as error:
        raise ModelLoadError(f"{source.path}: cannot read the weights: {error}") from error
    model_config = ModelConfig(
        context_length=int(text_config.get("max_position_embeddings") or 4096),
        vocab_size=int(text_config["vocab_size"]),
        num_layers=parts.decoder.num_layers,
        num_parameters=count_parameters(parts.module),
        weight_bytes=sum(array.nbytes for _, array in tree_flatten(parts.module.parameters())),
        quantized=has_quantized_layers(parts.module),
    )
    return LoadedModel(
        VisionLanguageModel(parts),
        tokenizer,
        model_config,
        family,
        source,
        time.perf_counter() - start,
        image_prompter=VisionPrompter(parts.processor, tokenizer),
    )


def _evaluate_weights(module: nn.Module, progress: LoadProgress | None) -> None:
    """Evaluate the weights one numbered layer at a time (`...layers.3.*` is one), the
    parameters outside numbered layers as one more step."""
    groups: dict[str, list[mx.array]] = {}
    for name, array in tree_flatten(module.parameters()):
        parts = name.split(".")
        cut = next((i + 1 for i, part in enumerate(parts) if part.isdigit()), 0)
        groups.setdefault(".".join(parts[:cut]), []).append(array)
    for done, arrays in enumerate(groups.values(), 1):
        mx.eval(arrays)
        if progress is not None:
            progress(done, len(groups))
