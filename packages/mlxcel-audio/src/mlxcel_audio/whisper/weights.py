"""Weights of the CTranslate2 and Hugging Face layouts, renamed to mlx-whisper's names.

Both functions return arrays keyed by the parameter paths of `model.Whisper`
(`encoder.blocks.0.attn.query.weight`, ...), with convolution weights in MLX's
(out, kernel, in) layout.
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np

from mlxcel_models.errors import ModelLoadError

_CT2_LEAVES = {"gamma": "weight", "beta": "bias", "weight": "weight", "bias": "bias"}
_CT2_SUBLAYERS = {
    "self_attention/layer_norm": "attn_ln",
    "self_attention/linear_1": "attn.out",
    "attention/layer_norm": "cross_attn_ln",
    "attention/linear_0": "cross_attn.query",
    "attention/linear_2": "cross_attn.out",
    "ffn/layer_norm": "mlp_ln",
    "ffn/linear_0": "mlp1",
    "ffn/linear_1": "mlp2",
}
_CT2_FUSED = {  # fused projections, split into these in order
    "self_attention/linear_0": ("attn.query", "attn.key", "attn.value"),
    "attention/linear_1": ("cross_attn.key", "cross_attn.value"),
}
_CT2_TOP = {
    "encoder/conv1": "encoder.conv1",
    "encoder/conv2": "encoder.conv2",
    "encoder/layer_norm": "encoder.ln_post",
    "decoder/layer_norm": "decoder.ln",
    "decoder/embeddings": "decoder.token_embedding",
}


def from_ctranslate2(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rename a CTranslate2 WhisperSpec's variables; int8/int16 weights are dequantized
    with their `weight_scale` (CTranslate2 stores round(w * scale))."""
    weights = {
        "encoder.positional_embedding": variables["encoder/position_encodings/encodings"],
        "decoder.positional_embedding": variables["decoder/position_encodings/encodings"],
    }
    for name, value in variables.items():
        prefix, _, leaf = name.rpartition("/")
        layer = re.fullmatch(r"(encoder|decoder)/layer_(\d+)/(.+)", prefix)
        # Scalars are options; the output projection is the embedding, tied.
        if leaf not in _CT2_LEAVES or value.ndim == 0 or not (layer or prefix in _CT2_TOP):
            continue
        if value.dtype in (np.int8, np.int16):
            scale = variables[f"{prefix}/weight_scale"]  # one per output channel
            value = value.astype(np.float32) / scale.reshape(-1, *[1] * (value.ndim - 1))
        if layer is None:
            if prefix.startswith("encoder/conv") and leaf == "weight":
                value = value.transpose(0, 2, 1)
            weights[_CT2_TOP[prefix] + "." + _CT2_LEAVES[leaf]] = value
            continue
        side, index, sublayer = layer.groups()
        base = f"{side}.blocks.{index}."
        if sublayer in _CT2_FUSED:
            targets = _CT2_FUSED[sublayer]
            for target, part in zip(targets, np.split(value, len(targets)), strict=True):
                if not (leaf == "bias" and target.endswith("key")):  # keys have no bias
                    weights[base + target + "." + _CT2_LEAVES[leaf]] = part
            continue
        target = _CT2_SUBLAYERS.get(sublayer)
        if target is None:
            raise ModelLoadError(f"unexpected CTranslate2 Whisper variable {name}")
        weights[base + target + "." + _CT2_LEAVES[leaf]] = value
    return weights


_HF_RENAMES = (
    (r"^model\.", ""),
    (r"^encoder\.embed_positions\.weight$", "encoder.positional_embedding"),
    (r"^decoder\.embed_positions\.weight$", "decoder.positional_embedding"),
    (r"^decoder\.embed_tokens\.", "decoder.token_embedding."),
    (r"^encoder\.layer_norm\.", "encoder.ln_post."),
    (r"^decoder\.layer_norm\.", "decoder.ln."),
    (r"\.layers\.", ".blocks."),
    (r"\.self_attn_layer_norm\.", ".attn_ln."),
    (r"\.encoder_attn_layer_norm\.", ".cross_attn_ln."),
    (r"\.final_layer_norm\.", ".mlp_ln."),
    (r"\.self_attn\.", ".attn."),
    (r"\.encoder_attn\.", ".cross_attn."),
    (r"\.q_proj\.", ".query."),
    (r"\.k_proj\.", ".key."),
    (r"\.v_proj\.", ".value."),
    (r"\.out_proj\.", ".out."),
    (r"\.fc1\.", ".mlp1."),
    (r"\.fc2\.", ".mlp2."),
)


def from_hugging_face(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """Rename a `WhisperForConditionalGeneration` (or `WhisperModel`) state dict; the tied
    output projection `proj_out.weight` is dropped."""
    weights = {}
    for name, value in tensors.items():
        if name == "proj_out.weight":
            continue
        for pattern, replacement in _HF_RENAMES:
            name = re.sub(pattern, replacement, name)
        if re.fullmatch(r"encoder\.conv\d\.weight", name):
            value = value.transpose(0, 2, 1)
        weights[name] = value
    return weights
