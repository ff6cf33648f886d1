"""Load-time model surgery on the tiny llama (float32 safetensors, and the Q8_0 GGUF kept
quantized): each operation's effect on the tensors and on greedy output, the edits
logged, and errors that name the surgery file's line."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcel_core.generate import generate_tokens
from mlxcel_core.sampling import Sampler, SamplingParams
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.loading.loader import load_model
from mlxcel_models.surgery import SurgeryError, read_surgery_file
from mlxcel_models.surgery.tensors import ModelTensors

from factories import TinyConfig, write_safetensors_model

PROMPT = (40, 41, 42, 43, 44, 45, 46, 47, 48)
GREEDY = SamplingParams(temperature=0.0)
HEAD_DIM = TinyConfig().head_dim  # 4 query heads, 2 key/value heads, 16 features each
# (fixture, compute options): float32 weights, and Q8_0 weights left quantized.
MODELS = [("tiny_safetensors", None), ("tiny_gguf", ComputeOptions())]


def greedy_tokens(loaded: LoadedModel, count: int = 12) -> list[int]:
    return list(itertools.islice(generate_tokens(loaded.model, PROMPT, Sampler(GREEDY)), count))


def logits(loaded: LoadedModel) -> np.ndarray:
    return np.array(loaded.model(mx.array([PROMPT]), loaded.model.make_cache()))


def tensor(loaded: LoadedModel, name: str) -> np.ndarray:
    """A tensor's float value, dequantized if quantized."""
    return np.array(ModelTensors(loaded.model.module).read(name))


def raw_parameters(loaded: LoadedModel) -> dict[str, np.ndarray]:
    return {name: np.array(a) for name, a in tree_flatten(loaded.model.module.parameters())}


def requantized(value: np.ndarray, *, scales_dtype: mx.Dtype) -> np.ndarray:
    """`value` through MLX's 8-bit affine quantization with group size 32 and back."""
    weight, scales, biases = mx.quantize(mx.array(value), group_size=32, bits=8)
    scales, biases = scales.astype(scales_dtype), biases.astype(scales_dtype)
    return np.array(mx.dequantize(weight, scales, biases, group_size=32, bits=8).astype(mx.float32))


def surgery_file(folder: Path, text: str) -> Path:
    path = folder / "surgery.yaml"
    path.write_text(text)
    return path


def load_with(path: Path, folder: Path, text: str, compute: ComputeOptions | None = None):
    return load_model(path, compute=compute, surgery=read_surgery_file(surgery_file(folder, text)))


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory) -> Path:
    """The tiny llama's shapes with other random weights."""
    return write_safetensors_model(tmp_path_factory.mktemp("other") / "seed1", TinyConfig(seed=1))


@pytest.mark.parametrize(("fixture", "compute"), MODELS)
def test_scaling_a_layers_output_projections_by_zero_equals_pruning_the_layer(
    request, tmp_path, fixture, compute
):
    path = request.getfixturevalue(fixture)
    scaled = load_with(path, tmp_path, """\
edits:
  - op: scale
    tensors: [model.layers.*.self_attn.o_proj.weight, model.layers.*.mlp.down_proj.weight]
    layers: 1
    factor: 0
""", compute)  # fmt: skip
    pruned = load_with(path, tmp_path, "edits:\n  - op: prune\n    layers: 1\n", compute)
    np.testing.assert_array_equal(logits(scaled), logits(pruned))
    assert greedy_tokens(scaled) == greedy_tokens(pruned)
    assert not np.allclose(logits(pruned), logits(load_model(path, compute=compute)))
    assert not tensor(pruned, "model.layers.1.mlp.down_proj.weight").any()
    assert tensor(pruned, "model.layers.0.mlp.down_proj.weight").any()


@pytest.mark.parametrize(("fixture", "compute"), MODELS)
def test_interpolating_a_model_with_itself_leaves_its_greedy_output_unchanged(
    request, tmp_path, fixture, compute
):
    path = request.getfixturevalue(fixture)
    base = load_model(path, compute=compute)
    text = f"edits:\n  - op: interpolate\n    tensors: '*'\n    from: {path}\n    alpha: 0.3\n"
    blended = load_with(path, tmp_path, text, compute)
    assert blended.surgery[0].num_tensors == len(ModelTensors(base.model.module).names)
    np.testing.assert_allclose(logits(blended), logits(base), rtol=1e-4, atol=1e-4)
    assert greedy_tokens(blended) == greedy_tokens(base)


def test_interpolating_halfway_averages_the_two_checkpoints(tmp_path, tiny_safetensors, other_seed):
    text = f"edits:\n  - op: interpolate\n    layers: 0\n    from: {other_seed}\n    alpha: 0.5\n"
    blended = load_with(tiny_safetensors, tmp_path, text)
    name = "model.layers.0.mlp.up_proj.weight"
    expected = tensor(load_model(tiny_safetensors), name) + tensor(load_model(other_seed), name)
    np.testing.assert_allclose(tensor(blended, name), expected / 2, rtol=1e-6)
    untouched = "model.layers.1.mlp.up_proj.weight"
    np.testing.assert_array_equal(
        tensor(blended, untouched), tensor(load_model(tiny_safetensors), untouched)
    )


def test_replace_takes_the_tensors_of_the_other_checkpoint(tmp_path, tiny_safetensors, other_seed):
    other = load_model(other_seed)
    text = (
        f"edits:\n  - op: replace\n    regex: 'model\\.layers\\.1\\..*'\n    from: {other_seed}\n"
    )
    replaced = raw_parameters(load_with(tiny_safetensors, tmp_path, text))
    base, donor = raw_parameters(load_model(tiny_safetensors)), raw_parameters(other)
    for name, value in replaced.items():
        expected = donor[name] if name.startswith("model.layers.1.") else base[name]
        np.testing.assert_array_equal(value, expected, err_msg=name)
    everything = load_with(
        tiny_safetensors,
        tmp_path,
        f"edits:\n  - {{op: replace, tensors: '*', from: {other_seed}}}\n",
    )
    np.testing.assert_array_equal(logits(everything), logits(other))
    assert greedy_tokens(everything) == greedy_tokens(other)


def test_pruning_heads_zeroes_exactly_their_rows_and_columns(tmp_path, tiny_safetensors):
    base = load_model(tiny_safetensors)
    one = load_with(tiny_safetensors, tmp_path, "edits:\n  - {op: prune, heads: 1, layers: 0}\n")
    head = slice(HEAD_DIM, 2 * HEAD_DIM)
    for name, axis in (("q_proj", 0), ("o_proj", 1)):
        full = f"model.layers.0.self_attn.{name}.weight"
        expected = tensor(base, full)
        np.moveaxis(expected, axis, 0)[head] = 0.0
        np.testing.assert_array_equal(tensor(one, full), expected, err_msg=name)
    # Everything else is untouched: query head 0 still reads key/value head 0.
    edited = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj")
    pruned_parameters = raw_parameters(one)
    for name, value in raw_parameters(base).items():
        if not name.startswith(edited):
            np.testing.assert_array_equal(pruned_parameters[name], value, err_msg=name)
    group = load_with(tiny_safetensors, tmp_path, "edits:\n  - {op: prune, heads: 0-1}\n")
    for layer in (0, 1):
        for name in ("k_proj", "v_proj"):
            full = f"model.layers.{layer}.self_attn.{name}.weight"
            assert not tensor(group, full)[:HEAD_DIM].any()
            np.testing.assert_array_equal(
                tensor(group, full)[HEAD_DIM:], tensor(base, full)[HEAD_DIM:]
            )


def test_pruning_mlp_channels_zeroes_their_rows_and_columns(tmp_path, tiny_safetensors):
    base = load_model(tiny_safetensors)
    pruned = load_with(
        tiny_safetensors, tmp_path, "edits:\n  - {op: prune, channels: [3, 10-12], layers: 1}\n"
    )
    dropped = [3, 10, 11, 12]
    for name, axis in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
        full = f"model.layers.1.mlp.{name}.weight"
        expected = tensor(base, full)
        np.moveaxis(expected, axis, 0)[dropped] = 0.0
        np.testing.assert_array_equal(tensor(pruned, full), expected, err_msg=name)
    assert pruned.surgery[0].num_tensors == 3


def test_add_a_constant_and_another_checkpoints_tensors(tmp_path, tiny_safetensors, other_seed):
    base, other = load_model(tiny_safetensors), load_model(other_seed)
    edited = load_with(tiny_safetensors, tmp_path, f"""\
edits:
  - op: add
    tensors: model.norm.weight
    value: 0.5
  - op: add
    tensors: model.layers.*.mlp.up_proj.weight
    from: {other_seed}
  - op: add
    tensors: model.layers.*.input_layernorm.weight
    from: {other_seed}
    tensor: model.norm.weight
""")  # fmt: skip
    np.testing.assert_allclose(
        tensor(edited, "model.norm.weight"), tensor(base, "model.norm.weight") + 0.5
    )
    up = "model.layers.1.mlp.up_proj.weight"
    np.testing.assert_allclose(tensor(edited, up), tensor(base, up) + tensor(other, up))
    norm = "model.layers.0.input_layernorm.weight"
    expected = tensor(base, norm) + tensor(other, "model.norm.weight")
    np.testing.assert_allclose(tensor(edited, norm), expected)
    assert [edit.num_tensors for edit in edited.surgery] == [1, 2, 2]


def test_quantized_weights_are_requantized_and_groups_left_unchanged_keep_their_values(
    tmp_path, tiny_gguf
):
    compute = ComputeOptions()  # the Q8_0 weights stay quantized, group size 32
    base = load_model(tiny_gguf, compute=compute)
    pruned = load_with(
        tiny_gguf, tmp_path, "edits:\n  - {op: prune, heads: 1, layers: 0}\n", compute
    )
    before, after = raw_parameters(base), raw_parameters(pruned)
    q_proj = "model.layers.0.self_attn.q_proj."
    rows = np.r_[0:HEAD_DIM, 2 * HEAD_DIM : 4 * HEAD_DIM]  # q_proj's groups run along rows
    for part in ("weight", "scales", "biases"):
        np.testing.assert_array_equal(after[q_proj + part][rows], before[q_proj + part][rows])
    assert not tensor(pruned, q_proj + "weight")[HEAD_DIM : 2 * HEAD_DIM].any()
    # o_proj's first group of 32 columns holds heads 0 and 1: it holds what MLX's own
    # quantization makes of the pruned float values (zeros become near zero).
    o_proj = "model.layers.0.self_attn.o_proj."
    expected = tensor(base, o_proj + "weight")
    expected[:, HEAD_DIM : 2 * HEAD_DIM] = 0.0
    np.testing.assert_array_equal(
        tensor(pruned, o_proj + "weight")[:, :32],
        requantized(expected, scales_dtype=mx.float16)[:, :32],
    )
    # The second group (heads 2 and 3): 8 packed words of 4 bytes, one scale, one bias.
    for part, second_group in (
        ("weight", np.s_[:, 8:]),
        ("scales", np.s_[:, 1:]),
        ("biases", np.s_[:, 1:]),
    ):
        np.testing.assert_array_equal(
            after[o_proj + part][second_group], before[o_proj + part][second_group]
        )
    assert after[o_proj + "scales"].dtype == before[o_proj + "scales"].dtype


def test_the_effective_edits_are_logged_one_line_each(tmp_path, tiny_safetensors, caplog):
    with caplog.at_level(logging.INFO, logger="mlxcel_models.surgery"):
        load_with(tiny_safetensors, tmp_path, """\
edits:
  - op: scale
    tensors: model.layers.*.self_attn.o_proj.weight
    factor: 0.5
  - op: prune
    heads: [2, 3]
    layers: 0-1
""")  # fmt: skip
    path = tmp_path / "surgery.yaml"
    assert [record.getMessage() for record in caplog.records] == [
        f"surgery {path}:2: scale x0.5: 2 tensors",
        f"surgery {path}:5: prune heads 2, 3 in layers 0-1: 8 tensors",
    ]


def one_edit(*keys: str) -> str:
    """A surgery file of one edit: `edits:` on line 1, the edit's keys from line 2 on."""
    return "edits:\n  - " + "\n    ".join(keys) + "\n"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (one_edit("op: scal", "tensors: '*'"), 2, "unknown op 'scal'; expected one of"),
        (one_edit("op: scale", "tensors: '*'", "factor: big"), 4, "expected a number, got 'big'"),
        (one_edit("op: scale", "tensors: '*'", "factor: .nan"), 4, "expected a finite number"),
        (one_edit("op: scale", "tensors: '*'"), 2, "the edit needs 'factor'"),
        (one_edit("op: scale", "factr: 2"), 3, "'factr' is not a key of a scale edit"),
        (one_edit("op: scale", "factor: 2"), 2, "needs 'tensors', 'regex' or 'layers'"),
        (one_edit("op: prune", "layers: 3-1"), 3, "ranges FIRST-LAST, got '3-1'"),
        (one_edit("op: prune", "tensors: '*'"), 2, "selects its tensors by 'layers'"),
        (one_edit("op: interpolate", "layers: 0", "from: .", "alpha: 1.5"), 5,
         "alpha must be in [0, 1], got 1.5"),
        (one_edit("op: replace", "layers: 0", "from: nowhere.gguf"), 4,
         "checkpoint 'nowhere.gguf' not found"),
        (one_edit("op: add", "tensors: '*'"), 2, "either 'value' or 'from'"),
        (one_edit("op: scale", "regex: 'model.('", "factor: 2"), 3, "regex 'model.(' is invalid"),
        ("edits: []\n", 1, "'edits' must be a non-empty list"),
        ("edit:\n  - op: scale\n", 1, "unknown key 'edit'; expected 'edits'"),
        ("edits:\n  - op: scale\n   factor: 2\n", 3, "not valid YAML"),
    ],
)  # fmt: skip
def test_invalid_files_fail_before_loading_with_their_line(tmp_path, text, line, message):
    path = surgery_file(tmp_path, text)
    with pytest.raises(SurgeryError) as caught:
        read_surgery_file(path)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (one_edit("op: scale", "tensors: model.layers.*.mlp.gate", "factor: 2"), 3,
         "pattern 'model.layers.*.mlp.gate' matches no tensor"),
        ("edits:\n  - op: scale\n    tensors:\n      - model.norm.weight\n"
         "      - lm_head.weight\n    factor: 2\n", 5,
         "pattern 'lm_head.weight' matches no tensor"),
        (one_edit("op: scale", "tensors: model.norm.weight", "layers: 0", "factor: 2"), 3,
         "pattern 'model.norm.weight' matches no tensor in layers 0"),
        (one_edit("op: prune", "layers: [0, 1-5]"), 3,
         "layers 1-5: outside the model, which has 2 layers (0-1)"),
        (one_edit("op: prune", "heads: [1,\n      4]"), 4,
         "heads 4: outside the model, which has 4 heads (0-3)"),
        (one_edit("op: prune", "channels: 128"), 3,
         "channels 128: outside the model, which has 128 channels (0-127)"),
    ],
)  # fmt: skip
def test_edits_that_do_not_fit_the_model_name_their_line(
    tmp_path, tiny_safetensors, text, line, message
):
    path = surgery_file(tmp_path, text)
    with pytest.raises(SurgeryError) as caught:
        load_model(tiny_safetensors, surgery=read_surgery_file(path))
    assert str(caught.value) == f"{path}:{line}: {message}"


def test_another_checkpoint_of_other_shapes_is_refused(tmp_path, tiny_safetensors):
    narrow = write_safetensors_model(tmp_path / "narrow", TinyConfig(hidden_size=32))
    up = "model.layers.0.mlp.up_proj.weight"
    text = one_edit("op: interpolate", f"tensors: {up}", "from: narrow", "alpha: 0.5")
    path = surgery_file(tmp_path, text)
    with pytest.raises(SurgeryError) as caught:
        load_model(tiny_safetensors, surgery=read_surgery_file(path))
    assert str(caught.value) == (
        f"{path}:2: {up} has shape (128, 64) in the model but (128, 32) in {narrow}"
    )


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(SurgeryError, match=r"cannot read surgery file .*missing\.yaml"):
        read_surgery_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("factor", "expected"), [("1e-3", 0.001), ("-2E+1", -20.0), (".5e1", 5.0), ("3", 3.0)]
)
def test_numbers_in_exponent_form_are_read_as_numbers(tmp_path, factor, expected):
    path = surgery_file(tmp_path, one_edit("op: scale", "tensors: '*'", f"factor: {factor}"))
    (edit,) = read_surgery_file(path).edits
    assert edit.factor == expected


def test_a_quoted_number_is_still_refused(tmp_path):
    path = surgery_file(tmp_path, one_edit("op: scale", "tensors: '*'", "factor: '1e-3'"))
    with pytest.raises(SurgeryError, match=r":4: expected a number, got '1e-3'"):
        read_surgery_file(path)
