"""Loading any supported model: detect, route to the format's loader, evaluate weights."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model as mlx_lm_load_model

from mlxcel_models.cache_kinds import UnsupportedCacheError
from mlxcel_models.compute import ComputeOptions, apply_compute_options, has_quantized_layers
from mlxcel_models.detection import ModelSource, detect_model, read_config
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.loaded import LoadedModel, ModelConfig, TypeConversion
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_model import load_gguf_model
from mlxcel_models.loading.gguf_quant import GGUFDequant
from mlxcel_models.metadata import FamilyMetadata, ModelKind, WeightFormat, family_for
from mlxcel_models.mlx_lm_models import count_parameters
from mlxcel_models.model_args import check_model_args
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
    gguf_dequant: GGUFDequant = GGUFDequant.AUTO,
) -> LoadedModel:
    """Load a GGUF file or a Hugging Face / mlx-lm safetensors folder.

    Args:
        path: a `.gguf` file or a folder with config.json and *.safetensors.
        progress: optional callback reporting weight evaluation per layer.
        compute: activation dtype and prefill tactic; None picks the measured best for the
            default device (`ComputeOptions.for_device`).
        surgery: weight edits applied after `compute`, before the weights are evaluated;
            the checkpoints it reads are loaded the same way, with the same options.
        gguf_dequant: how a GGUF file's quantized tensors load (`--gguf-dequant`).

    Raises:
        ModelLoadError: missing or corrupt files, an unsupported model type or
            quantization; the message names the problem in one line. `SurgeryError`
            for surgery that does not fit the model.
    """
    start = time.perf_counter()
    options = compute or ComputeOptions.for_device(mx.default_device())
    read = _read_model(path, options, gguf_dequant)
    module, source = read.module, read.source
    edits = ()
    if surgery is not None:
        edits = apply_surgery(
            module,
            surgery,
            read_checkpoint=lambda other: _read_model(other, options, gguf_dequant).module,
        )
    try:
        _evaluate_weights(module, progress)
    except RuntimeError as error:
        raise ModelLoadError(f"{source.path}: cannot read the weights: {error}") from error
    try:
        model = MlxLmLanguageModel(module, batches_rows=read.family.batches_rows)
    except UnsupportedCacheError as error:
        raise error.of_model(source.path, source.model_type) from error
    # A value the config checks let through that the model's first pass cannot run with.
    except ValueError as error:
        raise ModelLoadError(
            f"{source.config_file}: the {source.model_type} model cannot run with this "
            f"config: {error}"
        ) from error
    config = _model_config(module, model, read.context_length)
    seconds = time.perf_counter() - start
    return LoadedModel(
        model,
        read.tokenizer,
        config,
        read.family,
        source,
        seconds,
        surgery=edits,
        gguf_conversions=read.gguf_conversions,
    )


@dataclass(frozen=True)
class _ReadModel:
    module: nn.Module
    tokenizer: Tokenizer
    context_length: int
    source: ModelSource
    family: FamilyMetadata
    gguf_conversions: tuple[TypeConversion, ...] = ()


def _read_model(path: str | Path, options: ComputeOptions, gguf_dequant: GGUFDequant) -> _ReadModel:
    """The model at `path` with `options` applied, its weights not yet evaluated (those of
    a GGUF file are, as they are converted)."""
    source = detect_model(path)
    family = family_for(source.model_type, source.weight_format)
    if family.kind is ModelKind.VLM:
        raise ModelLoadError(
            f"{source.path} holds a vision-language model ({source.model_type}); "
            "mlxcel_vision.load_vision_model loads it (pip install 'mlxcel[vision]')"
        )
    conversions: tuple[TypeConversion, ...] = ()
    if source.weight_format is WeightFormat.GGUF:
        module, tokenizer, context_length, conversions = _load_gguf(source, gguf_dequant)
    else:
        module, tokenizer, context_length = _load_safetensors(source)
    apply_compute_options(module, options)
    return _ReadModel(module, tokenizer, context_length, source, family, conversions)


def _load_gguf(
    source: ModelSource, dequant: GGUFDequant
) -> tuple[nn.Module, Tokenizer, int, tuple[TypeConversion, ...]]:
    header = read_gguf_header(source.path, arrays=True)
    try:
        model = load_gguf_model(source.path, header, dequant=dequant)
    # Inconsistent metadata or tensor shapes surface as MLX's or mlx-lm's ValueError/TypeError.
    except (ValueError, TypeError) as error:
        raise ModelLoadError(
            f"{source.path}: the metadata and tensors do not describe a valid "
            f"{source.model_type} model: {error}"
        ) from error
    tokenizer = Tokenizer.from_gguf_metadata(header.metadata)
    context_length = model.config["max_position_embeddings"]
    return model.module, tokenizer, context_length, model.conversions


def _load_safetensors(source: ModelSource) -> tuple[nn.Module, Tokenizer, int]:
    # mlx-lm trusts the config's values; a missing key, a wrong type or a zero head count
    # is refused by name before its model classes run.
    check_model_args(read_config(source.path), where=source.config_file)
    try:
        module, config = mlx_lm_load_model(source.path, lazy=True)
    # mlx-lm reports a bad config as the ModelArgs constructor's TypeError, unreadable
    # safetensors as MLX's RuntimeError.
    except (ValueError, TypeError, KeyError, RuntimeError, OSError) as error:
        raise ModelLoadError(f"{source.path}: {error}") from error
    tokenizer = Tokenizer.from_folder(source.path)
    return module, tokenizer, int(config.get("max_position_embeddings", 4096))


def _evaluate_weights(module: nn.Module, progress: LoadProgress | None) -> None:
    layers = module.layers
    for index, layer in enumerate(layers):
        mx.eval(layer.parameters())
        if progress is not None:
            progress(index + 1, len(layers))
    mx.eval(module.parameters())


def _model_config(module: nn.Module, model: MlxLmLanguageModel, context_length: int) -> ModelConfig:
    parameters = [array for _, array in tree_flatten(module.parameters())]
    float_dtypes = {str(a.dtype) for a in parameters if mx.issubdtype(a.dtype, mx.floating)}
    return ModelConfig(
        context_length=context_length,
        vocab_size=model.vocab_size,
        num_layers=model.num_layers,
        num_parameters=count_parameters(module),
        weight_bytes=sum(array.nbytes for array in parameters),
        quantized=has_quantized_layers(module),
        float_dtype=float_dtypes.pop().removeprefix("mlx.core.")
        if len(float_dtypes) == 1
        else None,
    )
