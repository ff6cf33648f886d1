import json
import re

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.utils import load_model as mlx_lm_load_model

from mlxcel_models.detection import detect_model
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.loader import load_model
from mlxcel_models.memory import read_model_inventory
from mlxcel_models.metadata import WeightFormat

from factories import TinyConfig, write_safetensors_model

TOKENS = mx.array([[5, 80, 81, 200, 17, 42]])


def test_folder_loads_through_mlx_lm_classes(tiny_safetensors):
    loaded = load_model(tiny_safetensors)
    reference, _ = mlx_lm_load_model(tiny_safetensors)
    ours = loaded.model(TOKENS, loaded.model.make_cache())
    np.testing.assert_allclose(np.array(ours), np.array(reference(TOKENS)), atol=1e-5)
    assert loaded.source.weight_format is WeightFormat.SAFETENSORS
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("hello")) == "hello"


def test_mlx_lm_quantized_folder_loads(tmp_path, tiny_safetensors):
    from mlx_lm.utils import quantize_model, save_model

    model, config = mlx_lm_load_model(tiny_safetensors)
    model, config = quantize_model(model, config, group_size=32, bits=4)
    folder = tmp_path / "q4"
    save_model(folder, model)
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_safetensors / name).read_bytes())
    loaded = load_model(folder)
    assert loaded.model(TOKENS, loaded.model.make_cache()).shape == (1, 6, 263)
    np.testing.assert_allclose(
        np.array(loaded.model(TOKENS, loaded.model.make_cache())),
        np.array(model(TOKENS)),
        atol=1e-5,
    )


def test_last_only_returns_the_last_position(tiny_safetensors):
    loaded = load_model(tiny_safetensors)
    full = loaded.model(TOKENS, loaded.model.make_cache())
    last = loaded.model(TOKENS, loaded.model.make_cache(), last_only=True)
    assert last.shape == (1, 1, 263)
    np.testing.assert_allclose(np.array(last[:, 0]), np.array(full[:, -1]), atol=1e-5)


def test_detection_reads_model_type(tiny_safetensors):
    source = detect_model(tiny_safetensors)
    assert source.model_type == "llama"
    assert source.weight_format is WeightFormat.SAFETENSORS


def test_unknown_model_type_in_config(tmp_path):
    folder = write_safetensors_model(tmp_path / "m", TinyConfig())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "rwkv9"}))
    with pytest.raises(ModelLoadError, match="unsupported model type 'rwkv9'"):
        load_model(folder)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda folder: None, "holds no .safetensors"),
        (lambda folder: (folder / "w.safetensors").write_bytes(b"x"), "has no config.json"),
    ],
)
def test_folders_that_are_not_models(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(ModelLoadError, match=message):
        load_model(tmp_path)


def test_corrupt_config_json(tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"x")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot parse"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_attention_heads", 0, "num_attention_heads must be a positive integer, got 0"),
        ("num_key_value_heads", 0, "num_key_value_heads must be a positive integer, got 0"),
        ("num_key_value_heads", 3, r"num_attention_heads \(4\) must be a multiple of .*\(3\)"),
        ("hidden_size", 0, "hidden_size must be a positive integer, got 0"),
        ("num_hidden_layers", -1, "num_hidden_layers must be a positive integer, got -1"),
        ("intermediate_size", "128", "intermediate_size must be a positive integer, got '128'"),
        ("vocab_size", 0, "vocab_size must be a positive integer, got 0"),
    ],
)
def test_config_sizes_that_shape_no_model_are_named(tmp_path, field, value, message):
    folder = write_safetensors_model(tmp_path / "m", TinyConfig())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    where = rf"{re.escape(str(folder / 'config.json'))}: {message}"
    with pytest.raises(ModelLoadError, match=where):
        load_model(folder)
    with pytest.raises(ModelLoadError, match=where):
        read_model_inventory(folder)


def test_config_sizes_written_as_whole_floats_still_load(tmp_path):
    folder = write_safetensors_model(tmp_path / "m", TinyConfig())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048.0}))
    assert load_model(folder).config.context_length == 2048
