"""Tiny random-weight models written in real formats, for fast loader and CLI tests.

`write_gguf_model` writes a llama.cpp-style GGUF (Q/K rows permuted as llama.cpp's converter
does, chosen tensor types, a byte-level BPE vocabulary and a ChatML template);
`reference_weights` gives the Hugging Face-layout float weights that file must load as.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A Hermes/Qwen-style template: tools in a system block, calls as <tool_call> JSON.
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call a function with <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{{ message.content or '' }}
{%- for call in message.tool_calls %}<tool_call>
{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TinyConfig:
    """Shape of a tiny decoder; defaults give a GQA llama of about 0.2 M parameters."""

    architecture: str = "llama"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    context_length: int = 256
    tie_embeddings: bool = True
    attention_bias: bool = False
    qk_norm: bool = False
    llama3_rope_scaling: dict | None = None
    seed: int = 0
    extra_metadata: dict = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def byte_level_vocab() -> tuple[list[str], list[str], list[int]]:
    """A GPT-2 byte-level vocabulary: special tokens, 256 byte symbols, a few merges."""
    byte_symbols = [gguf.vocab.bytes_to_unicode()[byte] for byte in range(256)]
    merges = ["h e", "l l", "o Ġ", "he ll"]
    tokens = list(SPECIAL_TOKENS) + byte_symbols + [m.replace(" ", "") for m in merges]
    token_types = [3] * len(SPECIAL_TOKENS) + [1] * (len(tokens) - len(SPECIAL_TOKENS))
    return tokens, merges, token_types


def _random_weights(config: TinyConfig, vocab_size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(config.seed)
    D, F, hd = config.hidden_size, config.intermediate_size, config.head_dim
    H, K = config.num_heads, config.num_kv_heads

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(vocab_size, D)}
    weights["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    if not config.tie_embeddings:
        weights["lm_head.weight"] = matrix(vocab_size, D)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = np.ones(D, np.float32)
        weights[p + "post_attention_layernorm.weight"] = np.ones(D, np.float32)
        weights[p + "self_attn.q_proj.weight"] = matrix(H * hd, D)
        weights[p + "self_attn.k_proj.weight"] = matrix(K * hd, D)
        weights[p + "self_attn.v_proj.weight"] = matrix(K * hd, D)
        weights[p + "self_attn.o_proj.weight"] = matrix(D, H * hd)
        weights[p + "mlp.gate_proj.weight"] = matrix(F, D)
        weights[p + "mlp.up_proj.weight"] = matrix(F, D)
        weights[p + "mlp.down_proj.weight"] = matrix(D, F)
        if config.attention_bias:
            for name, rows in (("q", H * hd), ("k", K * hd), ("v", K * hd)):
                weights[p + f"self_attn.{name}_proj.bias"] = (
                    0.1 * rng.standard_normal(rows)
                ).astype(np.float32)
        if config.qk_norm:
            weights[p + "self_attn.q_norm.weight"] = np.ones(hd, np.float32)
            weights[p + "self_attn.k_norm.weight"] = np.ones(hd, np.float32)
    return weights


_TO_GGUF = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    module, suffix = hf_name.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, index, rest = module.split(".", 3)
        return f"blk.{index}.{_TO_GGUF[rest]}.{suffix}"
    return f"{_TO_GGUF[module]}.{suffix}"


def llama3_rope_factors(config: TinyConfig) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's converter writes for Llama 3.1 RoPE scaling."""
    scaling = config.llama3_rope_scaling
    dims = config.head_dim
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / config.rope_theta ** (np.arange(0, dims, 2) / dims):
        wavelen = 2 * np.pi / freq
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation of Q/K rows (convert_hf_to_gguf.py)."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _tensor_type(name: str, matrix_type: str) -> str:
    return (
        matrix_type
        if name.endswith("proj.weight") or "embed" in name or "lm_head" in name
        else "F32"
    )


def reference_weights(config: TinyConfig, matrix_type: str) -> dict[str, np.ndarray]:
    """The float values the GGUF written with `matrix_type` holds, in Hugging Face layout."""
    vocab_size = len(byte_level_vocab()[0])
    weights = _random_weights(config, vocab_size)
    result = {}
    for name, weight in weights.items():
        qtype = gguf.GGMLQuantizationType[_tensor_type(name, matrix_type)]
        if weight.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            weight = gguf.quants.dequantize(gguf.quants.quantize(weight, qtype), qtype)
        result[name] = weight.astype(np.float32)
    return result


def write_gguf_model(
    path: Path,
    config: TinyConfig = TinyConfig(),
    matrix_type: str = "Q8_0",
    chat_template: str = CHATML_TEMPLATE,
):
    """Write a tiny random model as GGUF; matrices in `matrix_type`, norms in F32.

    Returns:
        The path written.
    """
    tokens, merges, token_types = byte_level_vocab()
    arch = config.architecture
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)
    for key, value in config.extra_metadata.items():
        writer.add_string(key, value)
    for name, weight in _random_weights(config, len(tokens)).items():
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads
            weight = llama_cpp_permute(weight, heads)
        qtype = gguf.GGMLQuantizationType[_tensor_type(name, matrix_type)]
        if weight.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.quantize(weight, qtype)
            writer.add_tensor(_gguf_name(name), data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(_gguf_name(name), weight)
    if config.llama3_rope_scaling is not None:
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_safetensors_model(folder: Path, config: TinyConfig = TinyConfig()) -> Path:
    """Write a tiny random model as a Hugging Face folder (config, safetensors, tokenizer)."""
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    weights = _random_weights(config, len(byte_level_vocab()[0]))
    mx.save_safetensors(
        str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()}
    )
    hf_config = {
        "model_type": config.architecture,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "vocab_size": len(byte_level_vocab()[0]),
        "max_position_embeddings": config.context_length,
        "tie_word_embeddings": config.tie_embeddings,
        "head_dim": config.head_dim,
    }
    (folder / "config.json").write_text(json.dumps(hf_config))
    write_tokenizer(folder)
    return folder


def write_tokenizer(folder: Path) -> None:
    """Write the byte-level BPE tokenizer (`byte_level_vocab`) with a ChatML template into
    `folder`, as tokenizer.json and tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, merges, _ = byte_level_vocab()
    bpe = models.BPE(
        {token: i for i, token in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "chat_template": CHATML_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )


def write_sliding_window_model(folder: Path, config: TinyConfig, window: int) -> Path:
    """A tiny llama folder whose first layer is sliding-window attention (mlx-lm's
    `layer_types` / `sliding_window` config keys); the second stays full attention."""
    write_safetensors_model(folder, config)
    hf_config = json.loads((folder / "config.json").read_text())
    hf_config["layer_types"] = ["sliding_attention", "full_attention"]
    hf_config["sliding_window"] = window
    (folder / "config.json").write_text(json.dumps(hf_config))
    return folder
