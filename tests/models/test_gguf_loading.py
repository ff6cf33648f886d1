import importlib
import re
import struct
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest

from mlxcel_models.detection import detect_model
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.loader import load_model
from mlxcel_models.memory import read_model_inventory
from mlxcel_models.metadata import ModelKind, WeightFormat

from factories import TinyConfig, reference_weights, write_gguf_model

TOKENS = [5, 80, 81, 200, 17, 42, 9, 260]


def reference_logits(config: TinyConfig, matrix_type: str, tokens: list[int] = TOKENS) -> mx.array:
    """Logits of mlx-lm's own model class on the float weights the GGUF encodes."""
    weights = reference_weights(config, matrix_type)
    architecture = importlib.import_module(f"mlx_lm.models.{config.architecture}")
    args = architecture.ModelArgs.from_dict(
        {
            "model_type": config.architecture,
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers,
            "intermediate_size": config.intermediate_size,
            "num_attention_heads": config.num_heads,
            "num_key_value_heads": config.num_kv_heads,
            "rms_norm_eps": config.rms_norm_eps,
            "rope_theta": config.rope_theta,
            "vocab_size": weights["model.embed_tokens.weight"].shape[0],
            "head_dim": config.head_dim,
            "tie_word_embeddings": config.tie_embeddings,
            "max_position_embeddings": config.context_length,
            "rope_scaling": config.llama3_rope_scaling,
        }
    )
    model = architecture.Model(args)
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    return model(mx.array([tokens]))


def mlxcel_logits(path: Path, tokens: list[int] = TOKENS) -> mx.array:
    loaded = load_model(path)
    return loaded.model(mx.array([tokens]), loaded.model.make_cache()).astype(mx.float32)


@pytest.mark.parametrize("matrix_type", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_llama_gguf_matches_mlx_lm_on_the_same_weights(tmp_path, matrix_type):
    config = TinyConfig(tie_embeddings=matrix_type != "Q4_1")
    path = write_gguf_model(tmp_path / "m.gguf", config, matrix_type)
    ours, reference = mlxcel_logits(path), reference_logits(config, matrix_type)
    assert ours.shape == reference.shape == (1, len(TOKENS), 259 + 4)
    np.testing.assert_allclose(np.array(ours), np.array(reference), atol=3e-2, rtol=3e-2)
    assert mx.array_equal(ours.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize(
    "config",
    [
        TinyConfig(architecture="qwen2", attention_bias=True, tie_embeddings=False),
        TinyConfig(architecture="qwen3", qk_norm=True),
    ],
    ids=["qwen2", "qwen3"],
)
def test_qwen_gguf_matches_mlx_lm_on_the_same_weights(tmp_path, config):
    path = write_gguf_model(tmp_path / "m.gguf", config, "Q8_0")
    ours, reference = mlxcel_logits(path), reference_logits(config, "Q8_0")
    np.testing.assert_allclose(np.array(ours), np.array(reference), atol=3e-2, rtol=3e-2)


def test_llama3_rope_factors_match_mlx_lm_llama3_rope(tmp_path):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = TinyConfig(llama3_rope_scaling=scaling)
    path = write_gguf_model(tmp_path / "m.gguf", config, "F16")
    tokens = [(7 * i) % 250 + 3 for i in range(96)]
    ours = mlxcel_logits(path, tokens)
    np.testing.assert_allclose(
        np.array(ours), np.array(reference_logits(config, "F16", tokens)), atol=3e-2, rtol=3e-2
    )
    unscaled = reference_logits(TinyConfig(), "F16", tokens)
    assert not np.allclose(np.array(ours), np.array(unscaled), atol=3e-2, rtol=3e-2)


def test_loaded_model_carries_config_family_and_tokenizer(tiny_gguf):
    loaded = load_model(tiny_gguf)
    assert loaded.family.kind is ModelKind.TEXT
    assert loaded.source.weight_format is WeightFormat.GGUF
    assert loaded.config.context_length == 256
    assert loaded.config.num_layers == 2
    assert loaded.config.vocab_size == 263
    assert loaded.load_seconds > 0
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("hello world")) == "hello world"
    assert 2 in loaded.tokenizer.eos_token_ids


def test_progress_reports_every_layer(tiny_gguf):
    seen = []
    load_model(tiny_gguf, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]


def with_tensor_type(path: Path, name: str, type_id: int) -> Path:
    """Overwrite the ggml type of tensor `name` in the GGUF header of the file at `path`."""
    data = bytearray(path.read_bytes())
    encoded = name.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded) + 8 + len(encoded)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(data))
    return path


def test_a_tensor_type_gguf_cannot_dequantize_is_named(tmp_path):
    path = write_gguf_model(tmp_path / "m.gguf", TinyConfig(), "F16")
    # I16 takes as many bytes as F16: the file stays whole, only the type is foreign.
    with_tensor_type(path, "blk.0.attn_q.weight", gguf.GGMLQuantizationType.I16)
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_q\.weight.*I16 cannot be loaded"):
        load_model(path)


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    path = write_gguf_model(tmp_path / "m.gguf", TinyConfig(architecture="bloom"), "F16")
    with pytest.raises(ModelLoadError, match=r"GGUF architecture 'bloom'.*llama.*qwen2"):
        load_model(path)


def test_truncated_file_is_reported_as_corrupt(tmp_path, tiny_gguf):
    path = tmp_path / "truncated.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:2000])
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_model(path)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("notes.txt", b"hello", "neither a GGUF file nor a model folder"),
        ("missing.gguf", None, "model not found"),
    ],
)
def test_paths_that_hold_no_model(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=message):
        detect_model(path)


def test_absurd_header_counts_are_reported_as_corrupt(tmp_path, tiny_gguf):
    data = bytearray(tiny_gguf.read_bytes())
    data[16:24] = (2**40).to_bytes(8, "little")  # kv_count
    path = tmp_path / "absurd.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_model(path)


def test_inconsistent_vocabulary_is_a_load_error(tmp_path):
    config = TinyConfig()
    path = write_gguf_model(tmp_path / "m.gguf", config, "F16")
    data = path.read_bytes()
    merge = b"he ll"
    broken = data.replace(merge, b"hx ll", 1)
    assert broken != data
    path.write_bytes(broken)
    with pytest.raises(ModelLoadError, match="inconsistent GGUF vocabulary"):
        load_model(path)


def with_uint32_metadata(path: Path, key: str, value: int) -> Path:
    """Overwrite the uint32 value of GGUF metadata `key` in the file at `path`."""
    data = bytearray(path.read_bytes())
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    assert struct.unpack_from("<I", data, at)[0] == gguf.GGUFValueType.UINT32
    struct.pack_into("<I", data, at + 4, value)
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("attention.head_count", 0, "attention.head_count must be a positive integer, got 0"),
        ("attention.head_count_kv", 0, "head_count_kv must be a positive integer, got 0"),
        ("attention.head_count_kv", 3, r"head_count \(4\) must be a multiple of .*\(3\)"),
        ("embedding_length", 0, "embedding_length must be a positive integer, got 0"),
        ("block_count", 0, "block_count must be a positive integer, got 0"),
        ("feed_forward_length", 0, "feed_forward_length must be a positive integer, got 0"),
    ],
)
def test_hyperparameters_that_shape_no_model_are_named(tmp_path, key, value, message):
    path = with_uint32_metadata(
        write_gguf_model(tmp_path / "m.gguf", TinyConfig(), "F16"), f"llama.{key}", value
    )
    where = rf"{re.escape(str(path))}: llama\..*{message}"
    with pytest.raises(ModelLoadError, match=where):
        load_model(path)
    with pytest.raises(ModelLoadError, match=where):
        read_model_inventory(path)
