"""The three Whisper folder layouts load to the same network: CTranslate2 (written by
ctranslate2's own serializer), Hugging Face safetensors and mlx-whisper npz."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from ctranslate2.specs import whisper_spec

from mlxcel_audio.whisper import load_whisper
from mlxcel_audio.whisper.ctranslate2_format import read_model_bin
from mlxcel_models.errors import ModelLoadError

D, HEADS, LAYERS, MELS, VOCAB, AUDIO_CTX, TEXT_CTX = 64, 4, 2, 80, 51864, 1500, 448


def test_model_bin_parser_reads_the_real_tiny_en(tiny_en_path):
    spec_name, variables = read_model_bin(tiny_en_path / "model.bin")
    assert spec_name == "WhisperSpec"
    assert variables["encoder/conv1/weight"].shape == (384, 80, 3)
    assert variables["encoder/conv2/weight"].shape == (384, 384, 3)
    assert variables["encoder/position_encodings/encodings"].shape == (1500, 384)
    assert variables["encoder/layer_3/self_attention/linear_0/weight"].shape == (1152, 384)
    assert variables["decoder/layer_3/attention/linear_1/weight"].shape == (768, 384)
    assert variables["decoder/embeddings/weight"].shape == (51864, 384)
    assert variables["decoder/embeddings/weight"].dtype == np.float16
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    assert int(variables["encoder/num_heads"]) == 6
    assert not any(name.startswith("encoder/layer_4/") for name in variables)


def sinusoids(length: int, channels: int) -> np.ndarray:
    increment = np.log(10_000) / (channels // 2 - 1)
    times = np.arange(length)[:, None] * np.exp(-increment * np.arange(channels // 2))[None]
    return np.concatenate([np.sin(times), np.cos(times)], axis=1).astype(np.float32)


def random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """A small Whisper in OpenAI's per-projection names, float32."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {
        "encoder.conv1.weight": normal(D, MELS, 3), "encoder.conv1.bias": normal(D),
        "encoder.conv2.weight": normal(D, D, 3), "encoder.conv2.bias": normal(D),
        "encoder.positional_embedding": sinusoids(AUDIO_CTX, D),
        "encoder.ln_post.weight": 1 + normal(D), "encoder.ln_post.bias": normal(D),
        "decoder.token_embedding.weight": normal(VOCAB, D, scale=0.5),
        "decoder.positional_embedding": normal(TEXT_CTX, D),
        "decoder.ln.weight": 1 + normal(D), "decoder.ln.bias": normal(D),
    }  # fmt: skip
    for side in ("encoder", "decoder"):
        for i in range(LAYERS):
            attentions = ("attn", "cross_attn") if side == "decoder" else ("attn",)
            for attention in attentions:
                for projection in ("query", "key", "value", "out"):
                    weights[f"{side}.blocks.{i}.{attention}.{projection}.weight"] = normal(D, D)
                    if projection != "key":
                        weights[f"{side}.blocks.{i}.{attention}.{projection}.bias"] = normal(D)
            for norm in ("attn_ln", "cross_attn_ln", "mlp_ln")[: len(attentions) + 1]:
                norm = norm if norm != "cross_attn_ln" or side == "decoder" else "mlp_ln"
                weights[f"{side}.blocks.{i}.{norm}.weight"] = 1 + normal(D)
                weights[f"{side}.blocks.{i}.{norm}.bias"] = normal(D)
            weights[f"{side}.blocks.{i}.mlp1.weight"] = normal(4 * D, D)
            weights[f"{side}.blocks.{i}.mlp1.bias"] = normal(4 * D)
            weights[f"{side}.blocks.{i}.mlp2.weight"] = normal(D, 4 * D)
            weights[f"{side}.blocks.{i}.mlp2.bias"] = normal(D)
    return weights


def write_ctranslate2(folder: Path, weights: dict, tokenizer: Path, quantization: str) -> Path:
    """Fill ctranslate2's WhisperSpec and let it serialize model.bin."""
    weights = {name: value.copy() for name, value in weights.items()}  # optimize() mutates
    spec = whisper_spec.WhisperSpec(LAYERS, HEADS, LAYERS, HEADS)
    encoder, decoder = spec.encoder, spec.decoder
    for module, side in ((encoder.conv1, "encoder.conv1"), (encoder.conv2, "encoder.conv2")):
        module.weight, module.bias = weights[f"{side}.weight"], weights[f"{side}.bias"]
    encoder.position_encodings.encodings = weights["encoder.positional_embedding"]
    decoder.position_encodings.encodings = weights["decoder.positional_embedding"]
    decoder.embeddings.weight = weights["decoder.token_embedding.weight"]
    decoder.projection.weight = weights["decoder.token_embedding.weight"]
    _set_norm(encoder.layer_norm, weights, "encoder.ln_post")
    _set_norm(decoder.layer_norm, weights, "decoder.ln")
    for side, layers in (("encoder", encoder.layer), ("decoder", decoder.layer)):
        for i, layer in enumerate(layers):
            base = f"{side}.blocks.{i}."
            _set_attention(layer.self_attention, weights, base + "attn", fused_query=True)
            _set_norm(layer.self_attention.layer_norm, weights, base + "attn_ln")
            if side == "decoder":
                _set_attention(layer.attention, weights, base + "cross_attn", fused_query=False)
                _set_norm(layer.attention.layer_norm, weights, base + "cross_attn_ln")
            _set_norm(layer.ffn.layer_norm, weights, base + "mlp_ln")
            _set_linear(layer.ffn.linear_0, weights, base + "mlp1")
            _set_linear(layer.ffn.linear_1, weights, base + "mlp2")
    spec.register_vocabulary([f"t{i}" for i in range(VOCAB)])
    spec.config.suppress_ids, spec.config.suppress_ids_begin = [], [220, 50256]
    spec.validate()
    spec.optimize(quantization=quantization)
    folder.mkdir()
    spec.save(str(folder))
    shutil.copy(tokenizer, folder / "tokenizer.json")
    return folder


def _set_norm(spec, weights, name):
    spec.gamma, spec.beta = weights[f"{name}.weight"], weights[f"{name}.bias"]


def _set_linear(spec, weights, name):
    spec.weight, spec.bias = weights[f"{name}.weight"], weights[f"{name}.bias"]


def _set_attention(spec, weights, name, *, fused_query):
    zeros = np.zeros(D, dtype=np.float32)
    q, k, v = (weights[f"{name}.{p}.weight"] for p in ("query", "key", "value"))
    q_bias, v_bias = weights[f"{name}.query.bias"], weights[f"{name}.value.bias"]
    if fused_query:
        spec.linear[0].weight = np.concatenate([q, k, v])
        spec.linear[0].bias = np.concatenate([q_bias, zeros, v_bias])
        _set_linear(spec.linear[1], weights, f"{name}.out")
    else:
        spec.linear[0].weight, spec.linear[0].bias = q, q_bias
        spec.linear[1].weight = np.concatenate([k, v])
        spec.linear[1].bias = np.concatenate([zeros, v_bias])
        _set_linear(spec.linear[2], weights, f"{name}.out")


HF_NAMES = (
    (r"^encoder\.positional_embedding$", "model.encoder.embed_positions.weight"),
    (r"^decoder\.positional_embedding$", "model.decoder.embed_positions.weight"),
    (r"^decoder\.token_embedding\.", "model.decoder.embed_tokens."),
    (r"^encoder\.ln_post\.", "model.encoder.layer_norm."),
    (r"^decoder\.ln\.", "model.decoder.layer_norm."),
    (r"^(encoder|decoder)\.", r"model.\1."),
    (r"\.blocks\.", ".layers."),
    (r"\.cross_attn_ln\.", ".encoder_attn_layer_norm."),
    (r"\.attn_ln\.", ".self_attn_layer_norm."),
    (r"\.mlp_ln\.", ".final_layer_norm."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"\.attn\.", ".self_attn."),
    (r"\.(query|key|value)\.", lambda m: f".{m[1][0]}_proj."),
    (r"\.out\.", ".out_proj."),
    (r"\.mlp1\.", ".fc1."),
    (r"\.mlp2\.", ".fc2."),
)


def write_hugging_face(folder: Path, weights: dict, tokenizer: Path) -> Path:
    folder.mkdir()
    tensors = {}
    for name, value in weights.items():
        for pattern, replacement in HF_NAMES:
            name = re.sub(pattern, replacement, name)
        tensors[name] = mx.array(value)
    tensors["proj_out.weight"] = tensors["model.decoder.embed_tokens.weight"]
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    config = {
        "model_type": "whisper", "d_model": D, "encoder_layers": LAYERS,
        "decoder_layers": LAYERS, "encoder_attention_heads": HEADS,
        "decoder_attention_heads": HEADS, "num_mel_bins": MELS, "vocab_size": VOCAB,
        "max_source_positions": AUDIO_CTX, "max_target_positions": TEXT_CTX,
        "encoder_ffn_dim": 4 * D, "decoder_ffn_dim": 4 * D, "suppress_tokens": [],
        "begin_suppress_tokens": [220, 50256],
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(tokenizer, folder / "tokenizer.json")
    return folder


def write_mlx_whisper(folder: Path, weights: dict, tokenizer: Path) -> Path:
    """mlx-whisper's layout: MLX convolution layout, no encoder positions (computed)."""
    folder.mkdir()
    arrays = {
        name: value.transpose(0, 2, 1) if re.fullmatch(r"encoder\.conv\d\.weight", name) else value
        for name, value in weights.items()
        if name != "encoder.positional_embedding"
    }
    np.savez(folder / "weights.npz", **arrays)
    config = {
        "n_mels": MELS, "n_audio_ctx": AUDIO_CTX, "n_audio_state": D, "n_audio_head": HEADS,
        "n_audio_layer": LAYERS, "n_vocab": VOCAB, "n_text_ctx": TEXT_CTX, "n_text_state": D,
        "n_text_head": HEADS, "n_text_layer": LAYERS,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(tokenizer, folder / "tokenizer.json")
    return folder


def logits_of(folder: Path) -> np.ndarray:
    whisper = load_whisper(folder)
    features = mx.array(np.random.default_rng(1).standard_normal((1, 3000, MELS)), mx.float32)
    cross_kv = whisper.model.decoder.cross_kv(whisper.model.encoder(features))
    tokens = mx.array([[50257, 50363, 400, 1000, 50256]])
    logits, _ = whisper.model.decoder(tokens, cross_kv)
    return np.array(logits)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_en_path):
    weights = random_weights()
    root = tmp_path_factory.mktemp("whisper-layouts")
    tokenizer = tiny_en_path / "tokenizer.json"
    return {
        "ctranslate2": write_ctranslate2(root / "ct2", weights, tokenizer, "float32"),
        "ctranslate2-int8": write_ctranslate2(root / "ct2-int8", weights, tokenizer, "int8"),
        "hugging-face": write_hugging_face(root / "hf", weights, tokenizer),
        "mlx-whisper": write_mlx_whisper(root / "mlx", weights, tokenizer),
    }


def test_the_three_layouts_give_the_same_logits(folders):
    reference = logits_of(folders["ctranslate2"])
    assert reference.shape == (1, 5, VOCAB)
    np.testing.assert_allclose(logits_of(folders["hugging-face"]), reference, rtol=0, atol=1e-5)
    np.testing.assert_allclose(logits_of(folders["mlx-whisper"]), reference, rtol=0, atol=1e-4)


def test_int8_weights_are_dequantized_with_their_scales(folders):
    reference = logits_of(folders["ctranslate2"])
    int8 = logits_of(folders["ctranslate2-int8"])
    assert np.abs(int8 - reference).max() < 0.05 * np.abs(reference).max()
    assert np.corrcoef(int8.ravel(), reference.ravel())[0, 1] > 0.99


def test_the_loaders_read_suppress_tokens_and_detect_english_only(folders):
    whisper = load_whisper(folders["hugging-face"])
    assert not whisper.is_multilingual
    assert whisper.begin_suppress_tokens == (220, 50256)
    assert whisper.tokenizer.sot in whisper.suppress_tokens
    mlx_whisper = load_whisper(folders["mlx-whisper"])
    assert whisper.tokenizer.encode(" (")[0] in mlx_whisper.suppress_tokens  # non-speech


def test_folders_without_a_model_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="not a Whisper model folder"):
        load_whisper(tmp_path / "missing")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="holds no Whisper model"):
        load_whisper(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"\x06\x00\x00\x00\x05")
    with pytest.raises(ModelLoadError, match="truncated"):
        load_whisper(tmp_path)
