"""What a model's files say about its size, read from headers only: no tensor data.

A GGUF file's header lists each tensor's shape and ggml type; a safetensors folder has
config.json and, at the start of each `model*.safetensors` file, a JSON header with each
tensor's dtype and shape (https://huggingface.co/docs/safetensors/index#format).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcel_models.detection import (
    CONFIG_FILE,
    ModelSource,
    detect_model,
    model_type_from_config,
    read_config,
)
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.dimensions import check_config_dimensions
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_model import gguf_model_config
from mlxcel_models.loading.gguf_names import ROPE_FACTOR_TENSORS
from mlxcel_models.loading.gguf_quant import GGUFDequant, plan_tensor
from mlxcel_models.metadata import FamilyMetadata, ModelKind, WeightFormat, family_for
from mlxcel_models.vlm_config import vlm_text_config

_SAFETENSORS_DTYPES = {
    "F64": mx.float64, "F32": mx.float32, "F16": mx.float16, "BF16": mx.bfloat16,
    "I64": mx.int64, "I32": mx.int32, "I16": mx.int16, "I8": mx.int8,
    "U64": mx.uint64, "U32": mx.uint32, "U16": mx.uint16, "U8": mx.uint8, "BOOL": mx.bool_,
}  # fmt: skip
# The tensors on the path from a token to its first keys: their dtypes set the keys' dtype.
_KEY_PATH = {
    WeightFormat.GGUF: (
        "token_embd", "blk.0.attn_norm", "blk.0.attn_k", "blk.0.attn_k_norm",
    ),
    WeightFormat.SAFETENSORS: (
        "model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.k_norm",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Architecture:
    """The hyperparameters that size a decoder's weights, KV cache and activations.

    Attributes:
        num_layers: decoder layers, each with one attention layer.
        hidden_size: width of the residual stream.
        intermediate_size: width of the MLP.
        num_heads: query heads (0 for a family without attention layers).
        num_kv_heads: key/value heads.
        head_dim: features per key and per value head.
        vocab_size: rows of the embedding table.
        context_length: the context the model was trained for (tokens).
        kv_geometry: (heads, key features, value features) each layer stores, where
            not (num_kv_heads, head_dim, head_dim): multi-head latent attention stores its
            latent as one "head" (kv_lora_rank, qk_rope_head_dim) or, in the families that
            expand it first (DeepSeek V2, MiniCPM3), every query head's keys
            (qk_nope_head_dim + qk_rope_head_dim) and values (v_head_dim).
    """

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    kv_geometry: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class WeightTensor:
    """One weight as the loader reads it, before the device's compute options.

    Attributes:
        name: the tensor's name in the file (for a quantized layer, its `.weight`).
        num_elements: the values it holds, unpacked (a quantized matrix counts all of them).
        stored_type: how the file stores it ("Q4_1", "F16", "4-bit", ...).
        dtype: the float dtype it loads as; for a quantized tensor, its scales' and biases'.
        bits: bits per value of a quantized tensor; None for a float one.
        group_size: values per scale of a quantized tensor; None for a float one.
    """

    name: str
    num_elements: int
    stored_type: str
    dtype: mx.Dtype
    bits: int | None = None
    group_size: int | None = None

    @property
    def is_quantized(self) -> bool:
        return self.bits is not None


@dataclass(frozen=True)
class ModelInventory:
    """A model's architecture and weights, as its files describe them.

    Attributes:
        source: where it is and in which format.
        family: the family's metadata (a supported one).
        architecture: its hyperparameters.
        tensors: every weight the loader keeps as a parameter.
        file_bytes: the size of its weight files on disk.
        key_path_dtypes: the dtypes of the weights between a token and its keys (embedding,
            first norm, key projection); on a device that keeps the file's dtypes, keys come
            out in the type these promote to.
        config: the text model's config as mlx-lm's `ModelArgs` read it (from config.json,
            or made from the GGUF metadata).
    """

    source: ModelSource
    family: FamilyMetadata
    architecture: Architecture
    tensors: tuple[WeightTensor, ...]
    file_bytes: int
    key_path_dtypes: tuple[mx.Dtype, ...]
    config: dict[str, Any] = field(default_factory=dict)


def read_model_inventory(path: str | Path) -> ModelInventory:
    """Read a GGUF file's or a safetensors folder's headers.

    Raises:
        ModelLoadError: the path is missing, not a model, of an unsupported family, uses a
            tensor type mlxcel does not load, or its headers are corrupt or incomplete.
    """
    source = detect_model(path)
    family = family_for(source.model_type, source.weight_format)
    if source.weight_format is WeightFormat.GGUF:
        architecture, tensors, file_bytes, config = _read_gguf(source, family)
    else:
        architecture, tensors, file_bytes, config = _read_safetensors(source, family)
    by_name = {tensor.name.removesuffix(".weight"): tensor for tensor in tensors}
    key_path = tuple(
        by_name[name].dtype for name in _KEY_PATH[source.weight_format] if name in by_name
    )
    return ModelInventory(source, family, architecture, tensors, file_bytes, key_path, config)


def _read_gguf(
    source: ModelSource, family: FamilyMetadata
) -> tuple[Architecture, tuple[WeightTensor, ...], int, dict[str, Any]]:
    header = read_gguf_header(source.path)
    embedding = header.tensor_shapes.get("token_embd.weight")
    if embedding is None:
        raise ModelLoadError(f"{source.path} has no token_embd.weight tensor")
    # Array metadata (the token list) is not kept by the header reader; the embedding's rows
    # are the vocabulary.
    architecture = header.metadata.get("general.architecture")
    metadata = {**header.metadata, f"{architecture}.vocab_size": embedding[0]}
    config = gguf_model_config(replace(header, metadata=metadata), source.path)
    tensors = []
    for name, info in header.tensors.items():
        # llama.cpp's RoPE factors become a RoPE module's constant, not a parameter.
        if name in ROPE_FACTOR_TENSORS:
            continue
        # Matrices are taken to be linear or embedding weights, as nearly all are.
        try:
            form = plan_tensor(
                info.type_name,
                info.shape,
                quantizable=len(info.shape) >= 2,
                dequant=GGUFDequant.AUTO,
            )
        except ValueError as error:
            raise ModelLoadError(f"{source.path}: tensor '{name}': {error}") from error
        num_elements = math.prod(info.shape)
        if form.is_quantized:
            dtype = mx.uint8 if form.mode == "mxfp4" else mx.float16
            tensors.append(
                WeightTensor(name, num_elements, info.type_name, dtype, form.bits, form.group_size)
            )
        else:
            tensors.append(WeightTensor(name, num_elements, info.type_name, form.dtype))
    architecture = _architecture(config, attention=family.supports_paged_kv)
    return architecture, tuple(tensors), source.path.stat().st_size, config


# Names mlx-lm's families give each hyperparameter, most common first.
_SYNONYMS = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "model_dim", "hidden_dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
}


def _hyperparameter(config: dict[str, Any], name: str) -> Any:
    """`name` (or a synonym mlx-lm's families use) from `config`, else from its
    `text_config` (a multimodal checkpoint's language model); None when absent."""
    for key in _SYNONYMS.get(name, (name,)):
        if config.get(key) is not None:
            return config[key]
    text_config = config.get("text_config")
    return _hyperparameter(text_config, name) if isinstance(text_config, dict) else None


def _architecture(
    config: dict[str, Any], *, latent: bool = False, attention: bool = True
) -> Architecture:
    """The header's numbers; a family without attention layers (`attention` False: Mamba,
    RWKV) may have no head counts, and then has none."""

    def required(name: str) -> int:
        value = _hyperparameter(config, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise KeyError(name)
        return value

    if attention or _hyperparameter(config, "num_attention_heads") is not None:
        num_heads = required("num_attention_heads")
    else:
        num_heads = 0
    hidden_size = required("hidden_size")
    kv_geometry = _latent_attention_geometry(config, num_heads, hidden_size, latent=latent)
    num_kv_heads = _hyperparameter(config, "num_key_value_heads")
    return Architecture(
        num_layers=required("num_hidden_layers"),
        hidden_size=hidden_size,
        intermediate_size=int(_hyperparameter(config, "intermediate_size") or 4 * hidden_size),
        num_heads=num_heads,
        num_kv_heads=int(num_kv_heads if isinstance(num_kv_heads, int) else num_heads),
        head_dim=int(_hyperparameter(config, "head_dim") or hidden_size // max(num_heads, 1)),
        vocab_size=required("vocab_size"),
        context_length=int(_hyperparameter(config, "max_position_embeddings") or 4096),
        kv_geometry=kv_geometry,
    )


def _latent_attention_geometry(
    config: dict[str, Any], num_heads: int, hidden_size: int, *, latent: bool
) -> tuple[int, int, int] | None:
    """What a multi-head latent attention layer stores (see `Architecture.kv_geometry`);
    None for a config without a KV LoRA rank."""
    kv_lora_rank = _hyperparameter(config, "kv_lora_rank")
    if not isinstance(kv_lora_rank, int) or kv_lora_rank < 1:
        return None
    rope_dim = int(_hyperparameter(config, "qk_rope_head_dim") or 0)
    if latent:
        return (1, kv_lora_rank, rope_dim)
    nope_dim = int(_hyperparameter(config, "qk_nope_head_dim") or 0)
    value_dim = int(_hyperparameter(config, "v_head_dim") or hidden_size // num_heads)
    return (num_heads, nope_dim + rope_dim, value_dim)


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file: tensor name to dtype, shape and offsets.

    The file starts with the header's length in bytes (a little-endian u64); a length
    beyond the end of the file means the file is corrupt, and is refused before any of it
    is read.

    Raises:
        ModelLoadError: the file is unreadable or its header is truncated, too long for
            the file, or not a JSON object.
    """
    try:
        with path.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            available = path.stat().st_size - 8
            if length > available:
                raise ModelLoadError(
                    f"{path}: corrupt or truncated safetensors header (it claims {length} "
                    f"bytes; the file holds {max(available, 0)} after its length)"
                )
            header = json.loads(file.read(length))
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(
            f"{path}: corrupt or truncated safetensors header ({error})"
        ) from error
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def _read_safetensors(
    source: ModelSource, family: FamilyMetadata
) -> tuple[Architecture, tuple[WeightTensor, ...], int, dict[str, Any]]:
    config = read_config(source.path)
    model_type_from_config(config, source.path)
    # A vision-language model's KV cache and activations are its text model's.
    if family.kind is ModelKind.VLM:
        config = vlm_text_config(config, source.path)
    check_config_dimensions(config, source.path / CONFIG_FILE)
    files = sorted(source.path.glob("model*.safetensors"))
    if not files:
        raise ModelLoadError(f"{source.path} holds no model*.safetensors weights")
    entries: dict[str, tuple[mx.Dtype, tuple[int, ...]]] = {}
    for file in files:
        for name, entry in read_safetensors_header(file).items():
            try:
                entries[name] = (_SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]))
            except (KeyError, TypeError) as error:
                raise ModelLoadError(
                    f"{file}: tensor '{name}' has no usable dtype/shape"
                ) from error
    try:
        architecture = _architecture(
            config, latent=family.stores_latent_kv, attention=family.supports_paged_kv
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ModelLoadError(
            f"{source.path / 'config.json'} lacks a hyperparameter: {error}"
        ) from error
    tensors = _safetensors_weights(entries, config)
    return architecture, tensors, sum(file.stat().st_size for file in files), config


def _safetensors_weights(
    entries: dict[str, tuple[mx.Dtype, tuple[int, ...]]], config: dict[str, Any]
) -> tuple[WeightTensor, ...]:
    """The parameters mlx-lm keeps: its `sanitize` drops precomputed RoPE frequencies and,
    with tied embeddings, the LM head; a layer with `.scales` is quantized (mlx-lm's format:
    packed uint32 codes, then float scales and biases per group)."""
    skipped = {name for name in entries if name.endswith("rotary_emb.inv_freq")}
    # mlx-lm's llama and qwen2 arguments default to tied embeddings.
    if config.get("tie_word_embeddings", True):
        skipped.add("lm_head.weight")
    quantization = config.get("quantization") or {}
    tensors = []
    for name, (dtype, shape) in entries.items():
        # A quantized layer's scales and biases are counted with its `.weight`.
        if name in skipped or name.endswith((".scales", ".biases")):
            continue
        layer = name.removesuffix(".weight")
        scales = entries.get(f"{layer}.scales") if name.endswith(".weight") else None
        if scales is None:
            tensors.append(WeightTensor(name, math.prod(shape), _float_name(dtype), dtype))
            continue
        settings = quantization.get(layer) if isinstance(quantization.get(layer), dict) else {}
        group_size = int(settings.get("group_size", quantization.get("group_size", 64)))
        columns = scales[1][-1] * group_size
        bits = shape[-1] * 32 // columns
        num_elements = math.prod(shape[:-1]) * columns
        tensors.append(WeightTensor(name, num_elements, f"{bits}-bit", scales[0], bits, group_size))
    return tuple(tensors)


def _float_name(dtype: mx.Dtype) -> str:
    return {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}.get(dtype, str(dtype))
