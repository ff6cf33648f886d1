"""Loading any supported model: detect, route to the format's loader, evaluate weights."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model as mlx_lm_load_model

from mlxcel_models.compute import ComputeOptions, apply_compute_options, has_quantized_layers
from mlxcel_models.detection import CONFIG_FILE, ModelSource, detect_model, read_config
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.loaded import LoadedModel, ModelConfig
from mlxcel_models.loading.dimensions import check_config_dimensions
from mlxcel_models.loading.gguf_file import read_gguf
from mlxcel_models.loading.gguf_model import (
    ROPE_FACTORS_TENSOR,
    gguf_model_config,
    gguf_weights_to_mlx_lm,
    install_rope_factors,
    quantization_of,
)
from mlxcel_models.metadata import FamilyMetadata, ModelKind, WeightFormat, family_for
from mlxcel_models.mlx_lm_models import count_parameters, make_mlx_lm_model
from mlxcel_models.surgery import SurgeryPlan, apply_surgery
from mlxcel_models.tokenizer import Tokenizer

LoadProgress = Callable[[int, int], None]
"""Called with (layers evaluated, total layers) while weights are read."""


def load_model(
    path: str | Path,
    *,
    progress: LoadProgress | None = None,
    compute: ComputeOptions | None = None,
    surgery: SurgeryPlan | None = None,
) -> LoadedModel:
    """Load a GGUF file or a Hugging Face / mlx-lm safetensors folder.

    Args:
        path: a `.gguf` file or a folder with config.json and *.safetensors.
        progress: optional callback reporting weight evaluation per layer.
        compute: activation dtype and prefill tactic; None picks the measured best for the
            default device (`ComputeOptions.for_device`).
        surgery: weight edits applied after `compute`, before the weights are evaluated;
            the checkpoints it reads are loaded the same way, with the same options.

    Raises:
        ModelLoadError: missing or corrupt files, an unsupported model type or
            quantization; the message names the problem in one line. `SurgeryError`
            for surgery that does not fit the model.
    """
    start = time.perf_counter()
    options = compute or ComputeOptions.for_device(mx.default_device())
    module, tokenizer, context_length, source, family = _read_model(path, options)
    edits = ()
    if surgery is not None:
        edits = apply_surgery(
            module, surgery, read_checkpoint=lambda other: _read_model(other, options)[0]
        )
    model = MlxLmLanguageModel(module)
    try:
        _evaluate_weights(module, progress)
    except RuntimeError as error:
        raise ModelLoadError(f"{source.path}: cannot read the weights: {error}") from error
    config = _model_config(module, model.num_layers, context_length)
    seconds = time.perf_counter() - start
    return LoadedModel(model, tokenizer, config, family, source, seconds, surgery=edits)


def _read_model(
    path: str | Path, options: ComputeOptions
) -> tuple[nn.Module, Tokenizer, int, ModelSource, FamilyMetadata]:
    """The model at `path` with `options` applied, its weights not yet evaluated."""
    source = detect_model(path)
    family = family_for(source.model_type, source.weight_format)
    if family.kind is ModelKind.VLM:
        raise ModelLoadError(
            f"{source.path} holds a vision-language model ({source.model_type}); "
            "mlxcel_vision.load_vision_model loads it (pip install 'mlxcel[vision]')"
        )
    if source.weight_format is WeightFormat.GGUF:
        module, tokenizer, context_length = _load_gguf(source, family)
    else:
        module, tokenizer, context_length = _load_safetensors(source)
    apply_compute_options(module, options)
    return module, tokenizer, context_length, source, family


def _load_gguf(source: ModelSource, family: FamilyMetadata) -> tuple[nn.Module, Tokenizer, int]:
    contents = read_gguf(source.path)
    try:
        config = gguf_model_config(
            contents.metadata, set(contents.tensors), family, where=source.path
        )
        weights = gguf_weights_to_mlx_lm(contents.tensors, family, config)
        module = make_mlx_lm_model(config)
        nn.quantize(module, class_predicate=lambda path, _: quantization_of(weights, path) or False)
        module.load_weights(list(weights.items()), strict=True)
        if ROPE_FACTORS_TENSOR in contents.tensors:
            install_rope_factors(module, contents.tensors[ROPE_FACTORS_TENSOR], config)
    # Inconsistent metadata or tensor shapes surface as MLX's or mlx-lm's ValueError/TypeError.
    except (ValueError, TypeError) as error:
        raise ModelLoadError(
            f"{source.path}: the metadata and tensors do not describe a valid "
            f"{family.model_type} model: {error}"
        ) from error
    tokenizer = Tokenizer.from_gguf_metadata(contents.metadata)
    return module, tokenizer, config["max_position_embeddings"]


def _load_safetensors(source: ModelSource) -> tuple[nn.Module, Tokenizer, int]:
    # mlx-lm's model classes divide by the head counts; zeros are refused before they run.
    check_config_dimensions(read_config(source.path), source.path / CONFIG_FILE)
    try:
        module, config = mlx_lm_load_model(source.path, lazy=True)
    # mlx-lm reports a bad config as the ModelArgs constructor's TypeError, unreadable
    # safetensors as MLX's RuntimeError.
    except (ValueError, TypeError, KeyError, RuntimeError, OSError) as error:
        raise ModelLoadError(f"{source.path}: {error}") from error
    tokenizer = Tokenizer.from_folder(source.path)
    return module, tokenizer, int(config.get("max_position_embeddings", 4096))


def _evaluate_weights(module: nn.Module, progress: LoadProgress | None) -> None:
    layers = module.model.layers
    for index, layer in enumerate(layers):
        mx.eval(layer.parameters())
        if progress is not None:
            progress(index + 1, len(layers))
    mx.eval(module.parameters())


def _model_config(module: nn.Module, num_layers: int, context_length: int) -> ModelConfig:
    return ModelConfig(
        context_length=context_length,
        vocab_size=module.model.embed_tokens.weight.shape[0],
        num_layers=num_layers,
        num_parameters=count_parameters(module),
        weight_bytes=sum(array.nbytes for _, array in tree_flatten(module.parameters())),
        quantized=has_quantized_layers(module),
    )
