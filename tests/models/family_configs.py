"""Tiny random-weight configurations of every mlx-lm text family, and folders written from them.

`family_config(name)` starts from the family's `ModelArgs` fields: every field named in
`SMALL` takes its small value (whatever mlx-lm's default), then `OVERRIDES[name]` switches
on the family's own features (sliding windows shorter than the test's sequences, MoE with
several experts, MLA ranks, soft-capping, sinks …). `write_family_model` builds the model
with mlx-lm, sharpens its logits (see `sharpen_logits`) and saves it as a Hugging Face
folder with a byte-level BPE tokenizer.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from family_overrides import (
    LAYER_GAIN,
    LOGIT_SHARPENING,
    OVERRIDES,
    SLIDING_WINDOW,
    TEXT_ARGS,
    VOCAB_SIZE,
)
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import MODEL_REMAPPING

from factories import write_tokenizer

MAX_PARAMETERS = 2_000_000

# Small values for the fields many families share; only fields a family declares are set.
SMALL: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "layer_norm_eps": 1e-5,
    "layer_norm_epsilon": 1e-5,
    "norm_eps": 1e-5,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "sliding_window": SLIDING_WINDOW,
    "sliding_window_pattern": 2,
    "rope_scaling": None,
    "use_bias": False,
    "mlp_bias": False,
    "use_qk_norm": True,
    "qk_norm": True,
    "partial_rotary_factor": 0.5,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_dense_layers": 1,
    "num_nextn_predict_layers": 0,
    "query_pre_attn_scalar": 16,
    "n_embd": 64,
    "n_head": 4,
    "n_layer": 2,
    "n_inner": 96,
    "n_ctx": 512,
    "n_positions": 512,
    "moe_topk": 2,
    "moe_num_experts": 4,
    "moe_k": 2,
    "rotary_dim": 8,
    "original_max_position_embeddings": 512,
}


def module_name(model_type: str) -> str:
    """The mlx-lm module that runs `model_type` (its `MODEL_REMAPPING` applied)."""
    return MODEL_REMAPPING.get(model_type, model_type)


def family_config(model_type: str) -> dict[str, Any]:
    """A config.json for a tiny model of `model_type`."""
    args = importlib.import_module(f"mlx_lm.models.{module_name(model_type)}").ModelArgs
    module = module_name(model_type)
    config = _small_fields(args)
    config.update(OVERRIDES.get(model_type, OVERRIDES.get(module, {})))
    if module in TEXT_ARGS:
        text_module, text_class = TEXT_ARGS[module]
        text_args = getattr(importlib.import_module(f"mlx_lm.models.{text_module}"), text_class)
        config["text_config"] = {
            "model_type": text_module,
            **_small_fields(text_args),
            **config.get("text_config", {}),
        }
    config["model_type"] = model_type
    return config


def _small_fields(args: type) -> dict[str, Any]:
    fields = {field.name for field in dataclasses.fields(args)}
    return {name: value for name, value in SMALL.items() if name in fields}


def fill_zero_matrices(module: nn.Module) -> None:
    """Give matrices a model initializes to zeros (talkie's LM head) random values."""
    module.update(
        tree_map(
            lambda a: (
                mx.random.normal(a.shape) / a.shape[-1] ** 0.5
                if a.ndim >= 2 and not mx.any(a).item()
                else a
            ),
            module.parameters(),
        )
    )


def amplify_layers(module: nn.Module, gain: float, vocab_size: int = VOCAB_SIZE) -> None:
    """Scale every other matrix by `gain`, so the layers' updates outweigh a token's own
    embedding (with tied embeddings and small updates, a random model repeats its input)."""
    module.update(
        tree_map(
            lambda a: a * gain if a.ndim >= 2 and a.shape[0] != vocab_size else a,
            module.parameters(),
        )
    )


def sharpen_logits(module: nn.Module, factor: float, vocab_size: int = VOCAB_SIZE) -> None:
    """Scale every vocabulary-sized matrix (embedding tables, LM heads) by `factor`.

    Random tiny models have nearly uniform next-token distributions, so two correct
    implementations could pick different argmaxes from rounding alone; scaled heads put
    the winner well clear of the runner-up without changing which model runs.
    """
    scaled = tree_map(
        lambda a: a * factor if a.ndim == 2 and a.shape[0] == vocab_size else a,
        module.parameters(),
    )
    module.update(scaled)


# Families that load only weight packs: the mlx-lm module of their float model, whose
# weights are packed (`write_hadamard_pack`).
PACKED_FROM: dict[str, str] = {"prism_hadamard_qwen35": "qwen3_5"}


def write_hadamard_pack(weights: dict[str, mx.array], config: dict[str, Any]) -> None:
    """Replace, in `weights`, the float weight of each module of `config["modules"]` (a
    prism_hadamard_qwen35 manifest) by its 2-bit pack as mlx-lm's
    `HadamardQuantizedLinear` and `HadamardQuantizedEmbedding` read it: random signs
    (block > 0), the weight's input axis rotated forward as those layers rotate their
    inputs (`hadamard_rotate`: so a layer still computes x W^T, and an embedding row
    rotated back is the row), then quantized (affine, 2 bits, groups of 128) with float16
    scales and biases."""
    from mlx_lm.models.prism_hadamard_qwen35 import hadamard_rotate

    quantization = config["quantization"]
    for record in config["modules"]:
        key = f"language_model.{record['path']}"
        weight = weights.pop(f"{key}.weight")
        block = record["block"]
        if block:
            signs = mx.where(mx.random.uniform(shape=weight.shape[-1:]) < 0.5, -1.0, 1.0)
            weights[f"{key}.signs"] = signs
            weight = hadamard_rotate(weight, block, signs)
        packed, scales, biases = mx.quantize(
            weight, group_size=quantization["group_size"], bits=quantization["bits"]
        )
        weights[f"{key}.weight"] = packed
        weights[f"{key}.scales"] = scales.astype(mx.float16)
        weights[f"{key}.biases"] = biases.astype(mx.float16)


def pack_ternary_layers(module: nn.Module) -> None:
    """Give every BitLinear layer of `module` random ternary weights, packed four to a
    byte as mlx-lm's kernel reads them (`plain_kernels.bitlinear.unpack_ternary`), and a
    weight scale of 1 / sqrt(in_features), which keeps its outputs near unit size."""
    from mlx_lm.models.bitlinear_layers import BitLinear

    for _, layer in module.named_modules():
        if isinstance(layer, BitLinear):
            codes = mx.random.randint(0, 3, (4, *layer.weight.shape)).astype(mx.uint8)
            packed = codes[0] | (codes[1] << 2) | (codes[2] << 4) | (codes[3] << 6)
            layer.weight = packed.astype(mx.uint8)
            layer.weight_scale = mx.array([layer.in_features**-0.5])


def write_family_model(folder: Path, model_type: str, *, seed: int = 0) -> Path:
    """Write a tiny random `model_type` model as a Hugging Face folder (float32; a family
    of `PACKED_FROM` as its pack of a float model)."""
    config = family_config(model_type)
    float_module = PACKED_FROM.get(model_type, module_name(model_type))
    architecture = importlib.import_module(f"mlx_lm.models.{float_module}")
    mx.random.seed(seed)
    module = architecture.Model(architecture.ModelArgs.from_dict(config))
    num_parameters = sum(a.size for _, a in tree_flatten(module.parameters()))
    if num_parameters > MAX_PARAMETERS:
        raise ValueError(f"{model_type}: {num_parameters} parameters; the config is not tiny")
    module.update(tree_map(lambda a: a.astype(mx.float32), module.parameters()))
    fill_zero_matrices(module)
    name = module_name(model_type)
    vocab_size = config.get("vocab_size", VOCAB_SIZE)
    amplify_layers(module, LAYER_GAIN.get(name, 1.0), vocab_size)
    sharpen_logits(module, LOGIT_SHARPENING.get(name, 4.0), vocab_size)
    pack_ternary_layers(module)
    weights = dict(tree_flatten(module.parameters()))
    if model_type in PACKED_FROM:
        write_hadamard_pack(weights, config)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    write_tokenizer(folder)
    return folder
