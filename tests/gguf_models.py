"""Tiny random-weight mlx-lm models written as llama.cpp's converter writes them.

`write_converted_gguf` takes an mlx-lm model's float weights (Hugging Face names, which
mlx-lm keeps) and writes what `convert_hf_to_gguf.py` would: tensor names from gguf-py's
`TensorNameMap`, the Q/K rows permuted for llama.cpp's interleaved RoPE in the llama-style
families, Gemma's norms stored as `1 + w`, and the hyperparameters under `{arch}.*` keys.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlxcel_models.plain_kernels import route_plain_kernels

from factories import CHATML_TEMPLATE, byte_level_vocab, llama_cpp_permute

TensorSplit = Callable[[str, np.ndarray, dict[str, Any]], Iterable[tuple[str, np.ndarray]]]
ARCH_NAMES = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
VOCAB_SIZE = len(byte_level_vocab()[0])


@dataclass(frozen=True)
class ConvertedFamily:
    """One GGUF architecture and the tiny mlx-lm config written as it.

    Attributes:
        gguf_arch: `general.architecture`.
        config: the Hugging Face-style config of the mlx-lm model.
        metadata: the `{arch}.*` keys the converter writes (without the prefix), with the
            writer method names of gguf-py's `GGUFWriter` as keys.
        rope_permuted: the converter permutes Q/K rows (llama-style families).
        norm_offset: added to norm weights (Gemma).
        name_aliases: mlx-lm name fragment → Hugging Face fragment.
        split_tensor: the converter's rewrite of one tensor into those it writes
            (DeepSeek's `kv_b_proj` into `k_b_proj` and `v_b_proj`); none yielded drops it,
            a GGUF name (`blk.…`, `rope_factors_…`) is written as it is.
        weight_metadata: the metadata the converter makes of some weights (Apertus's
            xIELU constants), writer method names as keys.
        merge_tensors: the converter's merge of several tensors into one (RWKV-7's token
            shift mixes), on all the weights (mlx-lm names) before `split_tensor`.
    """

    gguf_arch: str
    config: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    rope_permuted: bool = False
    norm_offset: float = 0.0
    name_aliases: tuple[tuple[str, str], ...] = ()
    split_tensor: TensorSplit | None = None
    weight_metadata: Callable[[dict[str, np.ndarray]], dict[str, Any]] | None = None
    merge_tensors: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None


def make_reference(config: dict[str, Any], seed: int = 0):
    """mlx-lm's model for `config` with seeded random weights, and those weights (float32;
    BitLinear's packed ternary codes uint8), its Metal-only kernels run as mlxcel runs them
    on a device without Metal (`route_plain_kernels`)."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    route_plain_kernels(model)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        if value.dtype == mx.uint8:
            # Four ternary weights a byte, each stored as the weight + 1 (0, 1 or 2).
            codes = rng.integers(0, 3, size=(4, *value.shape), dtype=np.uint8)
            weights[name] = sum(codes[i] << (2 * i) for i in range(4)).astype(np.uint8)
        elif name.endswith("norm.weight") or ".norms." in name or "layernorm" in name:
            weights[name] = (1 + 0.1 * rng.standard_normal(value.shape)).astype(np.float32)
        else:
            scale = 1 / np.sqrt(value.shape[-1]) if value.ndim > 1 else 0.1
            weights[name] = (rng.standard_normal(value.shape) * scale).astype(np.float32)
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    return model, weights


def stored_weights(weights: dict[str, np.ndarray], matrix_type: str) -> dict[str, np.ndarray]:
    """The float values `write_converted_gguf` stores for `weights` (Hugging Face layout)."""
    qtype = gguf.GGMLQuantizationType[matrix_type]
    return {
        name: gguf.quants.dequantize(gguf.quants.quantize(weight, qtype), qtype)
        if _is_quantized_matrix(name, weight, qtype)
        else weight
        for name, weight in weights.items()
    }


_GGUF_NAMES = ("blk.", "rope_factors_")
# The token embedding under the names the families give it; it stays in float.
_TOKEN_EMBEDDINGS = ("embed_tokens.", "embed_in.", "wte.", "word_embeddings.", "tok_embeddings.")


def _is_quantized_matrix(name: str, weight: np.ndarray, qtype: gguf.GGMLQuantizationType) -> bool:
    is_embedding = any(embedding in name for embedding in _TOKEN_EMBEDDINGS)
    # The converter keeps norms (Mamba 2's grouped norm is 2-D), and llama.cpp convolution
    # kernels (Mamba's, LFM2's) and rows shorter than a block (Mamba 2's A and D), in float.
    is_kernel = "conv1d" in name or "conv.conv" in name or name.endswith("norm.weight")
    block_size = gguf.GGML_QUANT_SIZES[qtype][0]
    return (
        weight.ndim >= 2
        and qtype != gguf.GGMLQuantizationType.F32
        and weight.shape[-1] % block_size == 0
        and not is_embedding
        and not is_kernel
    )


def write_converted_gguf(
    path: Path, family: ConvertedFamily, weights: dict[str, np.ndarray], matrix_type: str = "F32"
) -> Path:
    """Write `weights` as llama.cpp's converter writes `family`; matrices other than the
    token embedding in `matrix_type`."""
    config = family.config
    tokens, merges, token_types = byte_level_vocab()
    writer = gguf.GGUFWriter(str(path), family.gguf_arch)
    hyperparameters = {
        "block_count": config["num_hidden_layers"],
        "context_length": config.get("max_position_embeddings", 256),
        "embedding_length": config["hidden_size"],
    }
    if "num_attention_heads" in config:
        hyperparameters |= {
            "feed_forward_length": config["intermediate_size"],
            "head_count": config["num_attention_heads"],
            "head_count_kv": config["num_key_value_heads"],
            "key_length": config["head_dim"],
            "value_length": config["head_dim"],
            "rope_freq_base": config.get("rope_theta", 10000.0),
        }
    if family.weight_metadata is not None:
        hyperparameters |= family.weight_metadata(weights)
    for method, value in (hyperparameters | family.metadata).items():
        add = getattr(writer, f"add_{method}", None)
        if add is None and isinstance(value, str):
            # A key newer than this gguf-py's writer (BitNet's `hidden_activation`).
            writer.add_string(f"{family.gguf_arch}.{method}", value)
        else:
            getattr(writer, f"add_{method}")(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    tensor_map = gguf.get_tensor_name_map(ARCH_NAMES[family.gguf_arch], config["num_hidden_layers"])
    for key, weight in _converted_tensors(family, weights):
        written_as_is = key.startswith(_GGUF_NAMES)
        gguf_name = key if written_as_is else tensor_map.get_name(key, (".weight", ".bias"))
        assert gguf_name is not None, f"gguf-py names no tensor for {key}"
        if family.rope_permuted and gguf_name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = config[
                "num_attention_heads" if ".attn_q." in gguf_name else "num_key_value_heads"
            ]
            weight = llama_cpp_permute(weight, heads)
        if family.norm_offset and gguf_name.endswith("norm.weight"):
            weight = weight + family.norm_offset
        qtype = gguf.GGMLQuantizationType[matrix_type]
        if _is_quantized_matrix(key, weight, qtype):
            data = gguf.quants.quantize(weight, qtype)
            writer.add_tensor(gguf_name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _converted_tensors(
    family: ConvertedFamily, weights: dict[str, np.ndarray]
) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, tensor) pairs as the converter sees them after its own changes."""
    if family.merge_tensors is not None:
        weights = family.merge_tensors(weights)
    for name, weight in weights.items():
        key = name
        for mlx_fragment, hf_fragment in family.name_aliases:
            key = key.replace(mlx_fragment, hf_fragment)
        if family.split_tensor is None:
            yield key, weight
        else:
            yield from family.split_tensor(key, weight, family.config)


def tiny_config(model_type: str, **overrides: Any) -> dict[str, Any]:
    config = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }
    return config | overrides


_MOE = {"num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2}
_MOE_KEYS = {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32}
_RMS = {"layer_norm_rms_eps": 1e-5}
_SWITCH = (("switch_mlp", "experts"),)

FAMILIES = {
    "llama": ConvertedFamily("llama", tiny_config("llama"), _RMS, rope_permuted=True),
    "mixtral": ConvertedFamily(
        "llama",
        tiny_config("mixtral", **_MOE),
        _RMS | {"expert_count": 4, "expert_used_count": 2},
        rope_permuted=True,
        name_aliases=(
            ("switch_mlp.gate_proj", "experts.w1"),
            ("switch_mlp.down_proj", "experts.w2"),
            ("switch_mlp.up_proj", "experts.w3"),
        ),
    ),
    "qwen2": ConvertedFamily("qwen2", tiny_config("qwen2", tie_word_embeddings=True), _RMS),
    "qwen3": ConvertedFamily("qwen3", tiny_config("qwen3"), _RMS),
    "qwen2_moe": ConvertedFamily(
        "qwen2moe",
        tiny_config(
            "qwen2_moe", **_MOE, moe_intermediate_size=32, shared_expert_intermediate_size=64
        ),
        _RMS | _MOE_KEYS | {"expert_shared_feed_forward_length": 64},
        name_aliases=_SWITCH,
    ),
    "qwen3_moe": ConvertedFamily(
        "qwen3moe",
        tiny_config(
            "qwen3_moe",
            **_MOE,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        ),
        _RMS | _MOE_KEYS,
        name_aliases=_SWITCH,
    ),
    "gemma": ConvertedFamily(
        "gemma", tiny_config("gemma", tie_word_embeddings=True), _RMS, norm_offset=1.0
    ),
    "gemma2": ConvertedFamily(
        "gemma2",
        tiny_config("gemma2", query_pre_attn_scalar=16.0, tie_word_embeddings=True),
        _RMS | {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
        norm_offset=1.0,
    ),
    "gemma3_text": ConvertedFamily(
        "gemma3",
        tiny_config(
            "gemma3_text",
            # mlx-lm's Gemma 3 looks up the first global layer's cache: six layers hold one.
            num_hidden_layers=6,
            query_pre_attn_scalar=16,
            sliding_window=512,
            sliding_window_pattern=6,
            rope_local_base_freq=10000.0,
            tie_word_embeddings=True,
        ),
        _RMS | {"sliding_window": 512},
        norm_offset=1.0,
    ),
    "phi3": ConvertedFamily("phi3", tiny_config("phi3"), _RMS | {"rope_dimension_count": 16}),
    "olmo2": ConvertedFamily("olmo2", tiny_config("olmo2"), _RMS),
    "granite": ConvertedFamily(
        "granite",
        tiny_config(
            "granite",
            logits_scaling=2.0,
            attention_multiplier=0.2,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_bias=False,
            mlp_bias=False,
        ),
        _RMS
        | {
            "logit_scale": 2.0,
            "attention_scale": 0.2,
            "embedding_scale": 3.0,
            "residual_scale": 0.5,
        },
        rope_permuted=True,
    ),
    "glm4": ConvertedFamily(
        "glm4",
        tiny_config("glm4", attention_bias=True, partial_rotary_factor=0.5),
        _RMS | {"rope_dimension_count": 8},
    ),
    "starcoder2": ConvertedFamily(
        "starcoder2", tiny_config("starcoder2", norm_epsilon=1e-5), {"layer_norm_eps": 1e-5}
    ),
    "stablelm": ConvertedFamily(
        "stablelm",
        tiny_config(
            "stablelm",
            use_qkv_bias=True,
            partial_rotary_factor=0.25,
            layer_norm_eps=1e-5,
        ),
        {"layer_norm_eps": 1e-5, "rope_dimension_count": 4},
    ),
    "cohere": ConvertedFamily(
        "command-r",
        tiny_config("cohere", logit_scale=0.5, layer_norm_eps=1e-5),
        {"layer_norm_eps": 1e-5, "logit_scale": 0.5},
    ),
    "smollm3": ConvertedFamily("smollm3", tiny_config("smollm3"), _RMS, rope_permuted=True),
}

FAMILIES |= {
    "granitemoe": ConvertedFamily(
        "granitemoe",
        tiny_config(
            "granitemoe",
            **_MOE,
            logits_scaling=2.0,
            attention_multiplier=0.2,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_bias=False,
        ),
        _RMS
        | {"expert_count": 4, "expert_used_count": 2}
        | {
            "logit_scale": 2.0,
            "attention_scale": 0.2,
            "embedding_scale": 3.0,
            "residual_scale": 0.5,
        },
        rope_permuted=True,
        # The converter splits Granite's fused `input_linear` into ffn_gate_exps and
        # ffn_up_exps, the names gguf-py gives stacked `mlp.experts` projections.
        name_aliases=(("block_sparse_moe.switch_mlp", "mlp.experts"),),
    ),
    "gpt_oss": ConvertedFamily(
        "gpt-oss",
        tiny_config("gpt_oss", **_MOE, intermediate_size=64, sliding_window=128),
        _RMS
        | {
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 64,
            "sliding_window": 128,
        },
    ),
    "exaone": ConvertedFamily(
        "exaone",
        tiny_config("exaone", num_layers=2, layer_norm_epsilon=1e-5),
        _RMS,
    ),
    "cohere2": ConvertedFamily(
        "cohere2",
        tiny_config(
            "cohere2",
            num_hidden_layers=4,
            logit_scale=0.5,
            layer_norm_eps=1e-5,
            sliding_window=128,
            sliding_window_pattern=4,
        ),
        {"layer_norm_eps": 1e-5, "logit_scale": 0.5, "sliding_window": 128},
    ),
}
