"""Qwen3.5 GGUF files (`qwen35`, `qwen35moe`): the converter's tiled value heads put back
exactly, in quantized files too, the multi-token-prediction layer left out, logits and greedy
tokens as llama.cpp computes them, and what mlx-lm's layout cannot hold refused. (Logits and
greedy tokens against mlx-lm on the same weights are checked with every family in
`test_gguf_architectures`.)"""

import dataclasses
import json
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architectures import GGUF_ARCHITECTURES
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_model import load_gguf_model
from mlxcel_models.loading.gguf_qwen35 import untile_value_heads
from mlxcel_models.loading.loader import load_model
from mlxcel_models.memory.inventory import read_model_inventory
from mlxcel_models.tokenizer import build_gguf_tokenizer

from gguf_models import FAMILIES, make_reference, stored_weights, write_converted_gguf
from gguf_qwen35_families import QWEN35_FAMILIES, tile_value_heads
from gguf_recurrent_families import RECURRENT_FAMILIES

PROMPT = [5, 80, 81, 200, 17, 42, 9, 260, 33, 7]
LLAMA_CPP = json.loads(
    (Path(__file__).parent / "data" / "qwen35_llama_cpp_logits.json").read_text()
)


def load(path):
    return load_gguf_model(path, read_gguf_header(path, arrays=True))


def greedy_tokens(model, count: int = 12) -> list[int]:
    return [int(token) for token, _ in generate_step(mx.array(PROMPT), model, max_tokens=count)]


@pytest.mark.parametrize("name", sorted(QWEN35_FAMILIES))
def test_qwen35_gguf_holds_the_checkpoint_weights(tmp_path, name):
    family = QWEN35_FAMILIES[name]
    _, weights = make_reference(family.config)
    loaded = load(write_converted_gguf(tmp_path / "m.gguf", family, weights))
    parameters = dict(tree_flatten(loaded.module.parameters()))
    assert parameters.keys() == weights.keys()
    for key, value in weights.items():
        np.testing.assert_allclose(np.array(parameters[key]), value, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(QWEN35_FAMILIES))
def test_qwen35_gguf_matches_llama_cpp_on_the_same_file(tmp_path, name):
    """The file the test writes is, tensor for tensor, what llama.cpp's converter writes for
    these weights; llama.cpp's logits and greedy tokens on it were recorded."""
    family = QWEN35_FAMILIES[name]
    loaded = load(
        write_converted_gguf(tmp_path / "m.gguf", family, make_reference(family.config)[1])
    )
    recorded = LLAMA_CPP["models"][name]
    assert LLAMA_CPP["prompt"] == PROMPT
    np.testing.assert_allclose(
        np.array(loaded.module(mx.array([PROMPT]))[0]), recorded["logits"], atol=2e-3, rtol=0
    )
    assert greedy_tokens(loaded.module) == recorded["greedy"]


@pytest.mark.parametrize("name", sorted(QWEN35_FAMILIES))
def test_qwen35_gguf_with_the_converters_recurrent_layer_flags(tmp_path, monkeypatch, name):
    """Newer converters also write `attention.recurrent_layers` (from `layer_types`, false
    for the prediction layer); gguf 0.19's writer has no method for it."""
    family = QWEN35_FAMILIES[name]
    layers, interval = family.config["num_hidden_layers"], family.config["full_attention_interval"]
    flags = [(i + 1) % interval != 0 for i in range(layers)] + [False]

    def add_recurrent_layers(writer: gguf.GGUFWriter, value: list[bool]) -> None:
        writer.add_array(f"{writer.arch}.attention.recurrent_layers", value)

    monkeypatch.setattr(
        gguf.GGUFWriter, "add_recurrent_layers", add_recurrent_layers, raising=False
    )
    flagged = dataclasses.replace(family, metadata=family.metadata | {"recurrent_layers": flags})
    reference, weights = make_reference(family.config)
    loaded = load(write_converted_gguf(tmp_path / "m.gguf", flagged, weights))
    assert (
        read_gguf_header(tmp_path / "m.gguf").metadata[
            f"{family.gguf_arch}.attention.recurrent_layers"
        ]
        == flags
    )
    tokens = mx.array([PROMPT])
    np.testing.assert_allclose(
        np.array(loaded.module(tokens)), np.array(reference(tokens)), atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize(
    "family",
    [QWEN35_FAMILIES["qwen3_5_moe"], FAMILIES["qwen2_moe"], RECURRENT_FAMILIES["qwen3_next"]],
    ids=lambda family: family.gguf_arch,
)
def test_gguf_requantized_by_llama_cpp_loads_its_squeezed_shared_expert_gate(tmp_path, family):
    """llama.cpp's quantizer writes every tensor with its trailing size-one axes dropped: the
    shared expert's gate, (1, hidden) from the converter, becomes (hidden,)."""

    def squeeze_shared_gate(name, weight, config):
        split = family.split_tensor(name, weight, config) if family.split_tensor else None
        for written, tensor in split if split is not None else [(name, weight)]:
            yield written, tensor.reshape(-1) if "shared_expert_gate" in written else tensor

    squeezed = dataclasses.replace(family, split_tensor=squeeze_shared_gate)
    reference, weights = make_reference(family.config)
    path = write_converted_gguf(tmp_path / "m.gguf", squeezed, weights)
    assert len(read_gguf_header(path).tensors["blk.0.ffn_gate_inp_shexp.weight"].shape) == 1
    tokens = mx.array([PROMPT])
    np.testing.assert_allclose(
        np.array(load(path).module(tokens)), np.array(reference(tokens)), atol=1e-4, rtol=1e-4
    )


def fuse_gate_up_experts(family):
    """`family` as `--fuse-gate-up-exps` converts it: each layer's expert gate and up
    projections (experts, ffn, hidden) concatenated on the rows into `ffn_gate_up_exps`."""
    gates = {}

    def fuse(name, weight, config):
        for hf_name, tensor in family.split_tensor(name, weight, config):
            if ".mlp.experts.gate_proj." in hf_name:
                gates[hf_name.split(".")[2]] = tensor
            elif ".mlp.experts.up_proj." in hf_name and not hf_name.startswith("blk."):
                layer = hf_name.split(".")[2]
                fused = np.concatenate([gates.pop(layer), tensor], axis=1)
                yield f"blk.{layer}.ffn_gate_up_exps.weight", fused
            else:
                yield hf_name, tensor

    return dataclasses.replace(family, split_tensor=fuse)


@pytest.mark.parametrize("matrix_type", ["F32", "Q8_0"])
def test_qwen35moe_gguf_with_fused_gate_up_experts(tmp_path, matrix_type):
    """The fused experts split back by rows, quantized ones in their packing."""
    family = QWEN35_FAMILIES["qwen3_5_moe"]
    _, weights = make_reference(family.config)
    path = write_converted_gguf(
        tmp_path / "m.gguf", fuse_gate_up_experts(family), weights, matrix_type
    )
    assert "blk.0.ffn_gate_up_exps.weight" in read_gguf_header(path).tensors
    reference = make_reference(family.config)[0]
    stored = stored_weights(weights, matrix_type)
    reference.load_weights([(k, mx.array(v)) for k, v in stored.items()], strict=True)
    loaded = load(path)
    gate = loaded.module.language_model.model.layers[0].mlp.switch_mlp.gate_proj
    assert isinstance(gate, QuantizedSwitchLinear) == (matrix_type == "Q8_0")
    tokens = mx.array([PROMPT])
    np.testing.assert_allclose(
        np.array(loaded.module(tokens)), np.array(reference(tokens)), atol=2e-3, rtol=2e-3
    )


def test_qwen35_config_leaves_out_the_prediction_layer_and_keeps_the_mrope_sections(tmp_path):
    family = QWEN35_FAMILIES["qwen3_5"]
    path = write_converted_gguf(tmp_path / "m.gguf", family, make_reference(family.config)[1])
    loaded = load_model(path)
    assert loaded.config.num_layers == 4
    config = load(path).config
    assert config["full_attention_interval"] == 2
    assert config["rope_parameters"] == {
        "type": "default",
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    }
    inventory = read_model_inventory(path)
    assert inventory.architecture.num_layers == 4
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("hello world")) == "hello world"


def test_untiling_inverts_the_converters_reorder_of_each_kind_of_tensor():
    config = {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 6,
        "linear_key_head_dim": 4,
        "linear_value_head_dim": 5,
    }
    rng = np.random.default_rng(0)
    qk_rows = 2 * 2 * 4
    cases = {
        "attn_qkv": (rng.standard_normal((qk_rows + 30, 7)), 0, qk_rows),
        "ssm_conv1d": (rng.standard_normal((qk_rows + 30, 4)), 0, qk_rows),
        "attn_gate": (rng.standard_normal((30, 7)), 0, 0),
        "ssm_beta": (rng.standard_normal((6, 7)), 0, 0),
        "ssm_dt": (rng.standard_normal(6), 0, 0),
        "ssm_out": (rng.standard_normal((7, 30)), 1, 0),
    }
    for base, (grouped, axis, skip) in cases.items():
        head_part = grouped[skip:] if axis == 0 else grouped
        tiled = tile_value_heads(head_part, axis, 2, 3)
        if skip:
            tiled = np.concatenate([grouped[:skip], tiled])
        assert not np.array_equal(tiled, grouped), base
        restored = untile_value_heads(base, {"weight": mx.array(tiled)}, config)
        np.testing.assert_array_equal(np.array(restored["weight"]), grouped.astype(np.float32))


def test_packed_columns_that_split_a_value_head_are_refused():
    config = {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
    }
    # 64 columns in groups of 32: a group holds two value heads.
    packed = {
        "weight": mx.zeros((8, 16), dtype=mx.uint32),
        "scales": mx.zeros((8, 2)),
        "biases": mx.zeros((8, 2)),
    }
    with pytest.raises(ModelLoadError, match=r"ssm_out.*whole quantization groups"):
        untile_value_heads("ssm_out", packed, config)


def test_qwen35_pre_tokenizer_keeps_combining_marks_with_their_letters(smollm2_path):
    """llama.cpp's `qwen35` regex is Qwen 2's with `\\p{M}` beside `\\p{L}`: a decomposed
    accent or a Devanagari vowel sign stays in its word, where Qwen 2's splits it off."""
    metadata = read_gguf_header(smollm2_path, arrays=True).metadata
    text = "cafe\u0301 \u0915\u093f\u0924\u093e\u092c 12 ok!"
    pieces = {}
    for pre in ("qwen2", "qwen35"):
        tokenizer = build_gguf_tokenizer({**metadata, "tokenizer.ggml.pre": pre})
        spans = tokenizer.pre_tokenizer.pre_tokenize_str(text)
        pieces[pre] = [text[start:end] for _, (start, end) in spans]
    assert pieces["qwen35"] == [
        "cafe\u0301",
        " \u0915\u093f\u0924\u093e\u092c",
        " ",
        "1",
        "2",
        " ok",
        "!",
    ]
    assert pieces["qwen2"][:2] == ["cafe", "\u0301"]


def _metadata(**overrides) -> GGUFMetadata:
    keys = {
        "block_count": 4,
        "embedding_length": 64,
        "feed_forward_length": 96,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "attention.key_length": 32,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "vocab_size": 300,
        "ssm.conv_kernel": 4,
        "ssm.state_size": 32,
        "ssm.group_count": 2,
        "ssm.time_step_rank": 4,
        "ssm.inner_size": 128,
        "full_attention_interval": 2,
    } | overrides
    return GGUFMetadata({f"qwen35.{k}": v for k, v in keys.items()}, set(), "qwen35")


def test_recurrent_layer_flags_off_the_interval_are_refused():
    arch = GGUF_ARCHITECTURES["qwen35"]
    flags = [True, False, True, False, False]
    assert arch.config(_metadata(**{"attention.recurrent_layers": flags}))["num_hidden_layers"] == 4
    with pytest.raises(ModelLoadError, match=r"recurrent_layers.*every 2"):
        arch.config(_metadata(**{"attention.recurrent_layers": [True, True, True, False]}))


def test_value_heads_that_do_not_group_over_key_heads_are_refused():
    with pytest.raises(ModelLoadError, match=r"time_step_rank \(3\).*group_count \(2\)"):
        GGUF_ARCHITECTURES["qwen35"].config(_metadata(**{"ssm.time_step_rank": 3}))
