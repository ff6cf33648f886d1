"""Gemma 4 GGUF files whose shape mlx-lm's `gemma4_text` cannot hold are refused with one
line naming what stands in the way, before any weight is read."""

from dataclasses import replace

import numpy as np
import pytest

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_model import gguf_model_config

from gguf_gemma_families import GEMMA_FAMILIES
from gguf_models import make_reference, write_converted_gguf


def config_of(tmp_path, name, metadata=None, drop=()):
    family = GEMMA_FAMILIES[name]
    merge = family.merge_tensors

    def without(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {key: value for key, value in merge(weights).items() if key not in drop}

    family = replace(family, metadata=family.metadata | (metadata or {}), merge_tensors=without)
    path = write_converted_gguf(tmp_path / "m.gguf", family, make_reference(family.config)[1])
    return gguf_model_config(read_gguf_header(path, arrays=True), path)


def test_the_mapped_files_give_mlx_lm_s_config(tmp_path):
    config = config_of(tmp_path, "gemma4_text_experts")
    assert config["attention_k_eq_v"] and config["num_global_key_value_heads"] == 1
    assert config["enable_moe_block"] and config["top_k_experts"] == 2
    dense = config_of(tmp_path, "gemma4_text")
    assert dense["use_double_wide_mlp"] and dense["num_kv_shared_layers"] == 2
    assert dense["rope_parameters"]["sliding_attention"]["rope_theta"] == 5000.0


@pytest.mark.parametrize(
    ("name", "metadata", "drop", "message"),
    [
        # Global layers with KV heads of their own need keys that are their values.
        ("gemma4_text", {"head_count_kv": [2, 1, 2, 1]}, (), "KV heads"),
        # Only doubling on the KV-sharing layers is a width mlx-lm has.
        ("gemma4_text", {"feed_forward_length": [96, 96, 96, 288]}, (), "feed-forward widths"),
        ("gemma4_text", {"rope_dimension_count_swa": 8}, (), "dimension_count_swa"),
        ("gemma4_text", {}, ("rope_freqs.weight",), "rope_freqs"),
        ("gemma4_text", {"sliding_window_pattern": [True, False]}, (), "one boolean per layer"),
    ],
)
def test_gemma4_files_mlx_lm_cannot_hold_are_refused(tmp_path, name, metadata, drop, message):
    with pytest.raises(ModelLoadError, match=message):
        config_of(tmp_path, name, metadata, drop)
