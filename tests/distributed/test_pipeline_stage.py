"""`PipelineStage` in one process: the body it runs, the parts each rank keeps, its errors.

The transfers between ranks are tested on real processes in test_pipeline_ranks.py.
"""

from __future__ import annotations

import importlib
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_distributed.pipeline_stage import (
    PipelineStage,
    append_trailer,
    make_pipeline_stage,
    split_trailer,
)
from mlxcel_models.language_model import MlxLmLanguageModel

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 97,
}
CONFIGS = {
    "llama-sliding": {
        **TINY,
        "model_type": "llama",
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": 3,
    },
    "qwen2-untied": {**TINY, "model_type": "qwen2", "tie_word_embeddings": False},
    "qwen3": {
        **TINY,
        "model_type": "qwen3",
        "head_dim": 16,
        "max_position_embeddings": 256,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
}


class FakeGroup:
    """Rank r of a group of n, for the parts of a stage that only read its position."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def make_model(config: dict[str, Any], seed: int = 0) -> MlxLmLanguageModel:
    mx.random.seed(seed)
    architecture = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    module = architecture.Model(architecture.ModelArgs.from_dict(config))
    mx.eval(module.parameters())
    return MlxLmLanguageModel(module)


def run_steps(model, tokens: list[int]) -> list[mx.array]:
    """Logits of a two-chunk prefill (every position, then the last) and two decode steps."""
    cache = model.make_cache()
    outputs = [model(mx.array([tokens[:4]]), cache)]
    outputs.append(model(mx.array([tokens[4:]]), cache, last_only=True))
    for token in (5, 11):
        outputs.append(model(mx.array([[token]]), cache, last_only=True))
    mx.eval(outputs)
    return outputs


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_single_stage_computes_the_models_logits(name):
    tokens = [3, 14, 15, 92, 65, 35, 89, 79]
    expected = run_steps(make_model(CONFIGS[name]), tokens)
    stage = make_pipeline_stage(make_model(CONFIGS[name]), mx.distributed.init())
    assert stage.layers == range(4)
    actual = run_steps(stage, tokens)
    for got, want in zip(actual, expected, strict=True):
        assert got.shape == want.shape
        assert mx.array_equal(got, want)


@pytest.mark.parametrize("tied", [True, False])
def test_each_rank_keeps_only_the_parts_it_runs(tied):
    config = {**CONFIGS["llama-sliding"], "tie_word_embeddings": tied}
    stages = []
    for rank, layers in enumerate([range(0, 1), range(1, 3), range(3, 4)]):
        module = make_model(config).module
        stages.append(PipelineStage(module, layers, FakeGroup(rank, 3)))
        body = module.model
        kept = [index for index, layer in enumerate(body.layers) if layer is not None]
        assert kept == list(layers)
        assert ("embed_tokens" in body) == (rank == 0 or (rank == 2 and tied))
        assert ("norm" in body) == (rank == 2)
        assert ("lm_head" in module) == (rank == 2 and not tied)
    assert [len(stage.make_cache()) for stage in stages] == [1, 2, 1]
    assert [stage.input_dtype for stage in stages] == [mx.float32] * 3
    assert stages[0].logits_dtype == mx.float32


def test_unsupported_families_are_refused_by_name():
    # Granite's body scales the embeddings and the logits: not the llama-style body.
    config = {
        **TINY,
        "model_type": "granite",
        "logits_scaling": 2.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.2,
        "max_position_embeddings": 256,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_theta": 10000.0,
    }
    with pytest.raises(ValueError, match="does not support model type 'granite'"):
        make_pipeline_stage(make_model(config), mx.distributed.init())


def test_more_ranks_than_layers_are_refused():
    with pytest.raises(ValueError, match="5 ranks but the model only 4 layers"):
        make_pipeline_stage(make_model(CONFIGS["qwen3"]), FakeGroup(0, 5))


@pytest.mark.parametrize("layers", [range(0), range(2, 5), range(0, 4, 2)])
def test_layer_ranges_outside_the_model_are_refused(layers):
    with pytest.raises(ValueError, match=r"non-empty contiguous range within 0\.\.3"):
        PipelineStage(make_model(CONFIGS["qwen3"]).module, layers, FakeGroup(0, 2))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_a_trailer_of_ints_rides_after_the_logits_bit_for_bit(dtype):
    logits = mx.random.normal((3, 5)).astype(dtype)
    # Steps, microseconds, and ints whose bytes read as NaN, infinity or subnormal floats.
    trailer = np.array([7, 1000, 0x7FC00001, -1, 0x7F800000, 1, 2**31 - 1, 0], np.int32)
    sent = append_trailer(logits, trailer)
    assert sent.dtype == dtype and sent.ndim == 1
    values, ints = split_trailer(sent, logits.size)
    assert mx.array_equal(values.reshape(3, 5), logits)
    np.testing.assert_array_equal(ints, trailer)
