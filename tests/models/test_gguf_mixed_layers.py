"""Layer patterns the GGUF loader rebuilds from per-layer metadata for the families whose
layers are of mixed kinds, and the files it refuses with a one-line error."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_kimi_linear import kimi_linear
from mlxcel_models.loading.gguf_local_global import mimo_v2_flash, sliding_layers
from mlxcel_models.loading.gguf_model import load_gguf_model
from mlxcel_models.loading.gguf_plamo2 import plamo2

from gguf_mixed_attention_families import MIXED_ATTENTION_FAMILIES
from gguf_models import make_reference, stored_weights, write_converted_gguf

PROMPT = [5, 80, 81, 200, 17, 42, 9, 260, 33, 7]


def metadata(arch: str, tensors: set[str] = frozenset(), **keys) -> GGUFMetadata:
    return GGUFMetadata(
        {f"{arch}.{key.replace('__', '.')}": value for key, value in keys.items()},
        set(tensors),
        arch,
        where="m.gguf",
    )


def plamo2_meta(num_layers: int, step: int, **keys) -> GGUFMetadata:
    """PLaMo 2's per-layer KV heads as the converter writes them for `mamba_step`."""
    if num_layers <= step // 2:
        attention = [i == num_layers - 1 for i in range(num_layers)]
    else:
        attention = [i % step == step // 2 for i in range(num_layers)]
    sizes = {"ssm__time_step_rank": 8, "ssm__inner_size": 128, "ssm__state_size": 16}
    sizes |= {"ssm__conv_kernel": 4}
    kv_heads = [2 if is_attention else 0 for is_attention in attention]
    return metadata(
        "plamo2", block_count=num_layers, attention__head_count_kv=kv_heads, **sizes | keys
    )


@pytest.mark.parametrize(("num_layers", "step"), [(8, 2), (8, 3), (9, 4), (6, 5), (2, 4)])
def test_plamo2_mamba_step_comes_back_from_the_kv_heads(num_layers, step):
    extras = plamo2(plamo2_meta(num_layers, step), {"head_dim": 16, "rope_theta": 10000.0})
    # A step that places the same layers is as good: the pattern is what mlx-lm builds.
    rebuilt = plamo2_meta(num_layers, extras["mamba_step"])
    original = plamo2_meta(num_layers, step)
    assert rebuilt.get("attention.head_count_kv") == original.get("attention.head_count_kv")


def test_plamo2_refuses_a_rope_base_mlx_lm_cannot_run():
    with pytest.raises(ModelLoadError, match=r"rope\.freq_base is 500000\.0"):
        plamo2(plamo2_meta(4, 2), {"head_dim": 16, "rope_theta": 500000.0})


def test_plamo2_refuses_attention_layers_no_step_places():
    meta = metadata(
        "plamo2",
        block_count=4,
        attention__head_count_kv=[2, 0, 0, 2],
        ssm__time_step_rank=8,
        ssm__inner_size=128,
    )
    with pytest.raises(ModelLoadError, match=r"attention layers \[0, 3\]"):
        plamo2(meta, {"head_dim": 16, "rope_theta": 10000.0})


@pytest.mark.parametrize("pattern", [[True] * 4, [False] * 4])
def test_sliding_layer_families_need_both_kinds(pattern):
    meta = metadata("mimo2", attention__sliding_window_pattern=pattern)
    with pytest.raises(ModelLoadError, match="needs both sliding-window and global layers"):
        sliding_layers(meta, 4)


def test_mimo2_refuses_kv_heads_that_differ_within_a_kind():
    meta = metadata(
        "mimo2",
        block_count=4,
        attention__sliding_window_pattern=[True, False, True, True],
        attention__head_count_kv=[1, 2, 2, 1],
    )
    config = {"num_hidden_layers": 4, "num_attention_heads": 4}
    with pytest.raises(ModelLoadError, match=r"every sliding layer, got \[1, 2\]"):
        mimo_v2_flash(meta, config)


def test_mimo2_reads_the_value_scale_and_refuses_rope_scaling():
    keys = {
        "block_count": 2,
        "attention__sliding_window_pattern": [True, False],
        "attention__head_count_kv": [1, 2],
        "attention__sliding_window": 4,
    }
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16}
    config |= {"rms_norm_eps": 1e-5}
    extras = mimo_v2_flash(metadata("mimo2", attention__value_scale=0.5, **keys), config)
    assert extras["attention_value_scale"] == 0.5
    scaled = config | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ModelLoadError, match=r"RoPE scaling \(yarn\) is not supported"):
        mimo_v2_flash(metadata("mimo2", **keys), scaled)


def test_kimi_linear_refuses_expert_layers_after_a_dense_one():
    routers = {"blk.1.ffn_gate_inp.weight", "blk.3.ffn_gate_inp.weight"}
    meta = metadata(
        "kimi-linear",
        routers,
        block_count=4,
        attention__head_count_kv=[0, 0, 1, 0],
        expert_count=4,
        leading_dense_block_count=1,
    )
    with pytest.raises(ModelLoadError, match="all after the 1 leading dense ones"):
        kimi_linear(meta, {"num_hidden_layers": 4, "num_attention_heads": 4})


@pytest.mark.parametrize("name", sorted(MIXED_ATTENTION_FAMILIES))
def test_quantized_mixed_layer_gguf_matches_mlx_lm_on_the_values_it_stores(tmp_path, name):
    """Q8_0 matrices through the loader's reshapes, joins and restorations (Kimi Linear's
    latent halves load dense, PLaMo 2's and Kimi's kernels stay in float)."""
    family = MIXED_ATTENTION_FAMILIES[name]
    reference, weights = make_reference(family.config)
    path = write_converted_gguf(tmp_path / "m.gguf", family, weights, "Q8_0")
    stored = stored_weights(weights, "Q8_0")
    reference.load_weights([(k, mx.array(v)) for k, v in stored.items()], strict=True)
    loaded = load_gguf_model(path, read_gguf_header(path, arrays=True))
    assert {c.type_name for c in loaded.conversions} == {"F32", "Q8_0"}
    tokens = mx.array([PROMPT])
    np.testing.assert_allclose(
        np.array(loaded.module(tokens)), np.array(reference(tokens)), atol=2e-3, rtol=2e-3
    )
    assert greedy(loaded.module) == greedy(reference)


def greedy(model, count: int = 12) -> list[int]:
    steps = generate_step(mx.array(PROMPT), model, max_tokens=count)
    return [int(token) for token, _ in steps]
