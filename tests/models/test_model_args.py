"""`make_model_args`: a config is checked against its family's `ModelArgs` fields."""

from __future__ import annotations

import pytest
from family_configs import family_config

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.mlx_lm_families import mlx_lm_text_families
from mlxcel_models.mlx_lm_models import make_mlx_lm_model
from mlxcel_models.model_args import check_model_args, config_error, make_model_args


def test_every_familys_tiny_config_passes_the_checks():
    # The configurations the family tests build every family from: no false refusals.
    for model_type in sorted(set(mlx_lm_text_families()) - {"olmo"}):
        check_model_args(family_config(model_type), where=model_type)


def test_a_family_module_that_exits_on_import_is_a_load_error():
    # mlx-lm's olmo module exits unless the ai2-olmo package (and PyTorch) imports.
    with pytest.raises(ModelLoadError, match="pip install ai2-olmo"):
        check_model_args({"model_type": "olmo"}, where="x")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"rms_norm_eps": "small"}, "rms_norm_eps must be a number, got 'small'"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers must be a positive integer"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok must be between 1 and num_experts"),
    ],
)
def test_a_bad_value_is_named_with_its_file(edit, message):
    config = {**family_config("qwen3_moe"), **edit}
    with pytest.raises(ModelLoadError, match=message) as refusal:
        make_mlx_lm_model(config, where="m/config.json")
    assert str(refusal.value).startswith("m/config.json")


def test_a_value_the_model_refuses_is_a_load_error_naming_the_file():
    config = {**family_config("llama"), "rope_scaling": {"rope_type": "bogus", "factor": 2.0}}
    with pytest.raises(ModelLoadError, match=r"^x: Unsupported RoPE type bogus$"):
        make_mlx_lm_model(config, where="x")


def test_accepted_spellings_of_numbers_and_nulls():
    config = family_config("llama")
    # A whole float for an integer, an integer for a float, null for a field with a default.
    args = make_model_args(
        {**config, "max_position_embeddings": 2048.0, "rope_theta": 10000, "head_dim": None},
        where="x",
    )
    assert args.rope_theta == 10000


def test_a_constructors_missing_argument_is_named_as_the_key_the_config_lacks():
    # Families with a from_dict of their own (a nested text_config) are checked by it.
    error = TypeError("TextArgs.__init__() missing 1 required positional argument: 'vocab_size'")
    assert str(config_error(error, "x")) == "x lacks a hyperparameter: 'vocab_size'"


def test_a_sliding_window_must_be_positive():
    config = {**family_config("gemma3_text"), "sliding_window": 0}
    with pytest.raises(ModelLoadError, match="sliding_window must be a positive integer, got 0"):
        make_mlx_lm_model(config, where="x")


def test_step3p5_takes_a_rope_base_per_layer_which_other_families_refuse():
    step = {"model_type": "step3p5", "hidden_size": 64, "num_hidden_layers": 2}
    step |= {"vocab_size": 32, "num_attention_heads": 4, "num_attention_groups": 2}
    step |= {"head_dim": 16, "intermediate_size": 96}
    args = make_model_args({**step, "rope_theta": [1e6, 1e4]}, where="x")
    assert args.rope_theta == [1e6, 1e4]
    with pytest.raises(ModelLoadError, match="rope_theta must be a number"):
        make_model_args({**family_config("llama"), "rope_theta": [1e6, 1e4]}, where="x")
