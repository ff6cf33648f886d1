"""The text model's config inside a vision-language config.json, completed."""

from pathlib import Path

import pytest

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.vlm_config import vlm_text_config

WHERE = Path("/models/llava")


def test_a_sparse_text_config_gets_transformers_defaults():
    # As llava-hf/llava-1.5-7b-hf writes it: little more than the vocabulary.
    config = {
        "model_type": "llava",
        "text_config": {"model_type": "llama", "vocab_size": 32064, "rms_norm_eps": 1e-5},
    }
    text = vlm_text_config(config, WHERE)
    assert text["model_type"] == "llama"
    assert (text["vocab_size"], text["rms_norm_eps"]) == (32064, 1e-5)
    assert (text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"]) == (
        4096,
        32,
        32,
    )
    assert text["rope_theta"] == 10000.0


def test_rope_parameters_reach_the_fields_mlx_lm_reads():
    scaled = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    config = {
        "model_type": "llava_next",
        "text_config": {"model_type": "mistral", "rope_parameters": scaled},
    }
    text = vlm_text_config(config, WHERE)
    assert text["rope_theta"] == 1e6
    assert text["rope_scaling"]["rope_type"] == "linear"
    assert text["rope_scaling"]["factor"] == 2.0


def test_an_unknown_model_type_is_a_load_error():
    with pytest.raises(ModelLoadError, match=r"/models/llava/config\.json"):
        vlm_text_config({"model_type": "no_such_vlm"}, WHERE)
