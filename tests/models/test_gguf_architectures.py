"""Each mapped GGUF architecture, written as llama.cpp's converter writes a tiny random
mlx-lm model, loads into the same mlx-lm family and generates the same greedy tokens."""

import re
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step

from mlxcel_models.loading.gguf_architectures import GGUF_ARCHITECTURES, gguf_model_types
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_mla import latent_attention_weights
from mlxcel_models.loading.gguf_model import load_gguf_model
from mlxcel_models.memory.inventory import read_model_inventory

from gguf_conversions import split_kv_b
from gguf_expert_families import EXPERT_FAMILIES
from gguf_families import MORE_FAMILIES
from gguf_gemma_families import GEMMA_FAMILIES
from gguf_latent_families import LATENT_FAMILIES
from gguf_layered_families import LAYERED_FAMILIES
from gguf_mixed_attention_families import MIXED_ATTENTION_FAMILIES
from gguf_mla_families import MLA_GROUP_FAMILIES
from gguf_models import FAMILIES as BASE_FAMILIES
from gguf_models import make_reference, stored_weights, write_converted_gguf
from gguf_qwen35_families import QWEN35_FAMILIES
from gguf_recurrent_families import RECURRENT_FAMILIES

FAMILIES = (
    BASE_FAMILIES
    | MORE_FAMILIES
    | LATENT_FAMILIES
    | RECURRENT_FAMILIES
    | EXPERT_FAMILIES
    | LAYERED_FAMILIES
    | MIXED_ATTENTION_FAMILIES
    | MLA_GROUP_FAMILIES
    | GEMMA_FAMILIES
    | QWEN35_FAMILIES
)

MODELS_DOC = Path(__file__).parents[2] / "docs" / "models.md"
PROMPT = [5, 80, 81, 200, 17, 42, 9, 260, 33, 7]


def greedy_tokens(model, count: int = 12) -> list[int]:
    steps = generate_step(mx.array(PROMPT), model, max_tokens=count)
    return [int(token) for token, _ in steps]


def load(path):
    return load_gguf_model(path, read_gguf_header(path, arrays=True))


def test_every_converted_model_is_a_mapped_family():
    assert {family.config["model_type"] for family in FAMILIES.values()} <= gguf_model_types()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_gguf_of_each_family_matches_mlx_lm_on_the_same_weights(tmp_path, name):
    family = FAMILIES[name]
    reference, weights = make_reference(family.config)
    path = write_converted_gguf(tmp_path / "m.gguf", family, weights)
    loaded = load(path)
    assert loaded.config["model_type"] == family.config["model_type"]
    tokens = mx.array([PROMPT])
    np.testing.assert_allclose(
        np.array(loaded.module(tokens)), np.array(reference(tokens)), atol=1e-4, rtol=1e-4
    )
    assert greedy_tokens(loaded.module) == greedy_tokens(reference)


@pytest.mark.parametrize(
    "name",
    sorted(
        RECURRENT_FAMILIES
        | EXPERT_FAMILIES
        | LAYERED_FAMILIES
        | MIXED_ATTENTION_FAMILIES
        | GEMMA_FAMILIES
    ),
)
def test_gguf_of_each_recurrent_or_expert_family_holds_the_checkpoint_weights(tmp_path, name):
    """Every layout change undone exactly, including those the logits cannot show (the Q/K
    permutation of attention without RoPE)."""
    family = FAMILIES[name]
    _, weights = make_reference(family.config)
    loaded = load(write_converted_gguf(tmp_path / "m.gguf", family, weights))
    parameters = dict(tree_flatten(loaded.module.parameters()))
    assert parameters.keys() == weights.keys()
    for key, value in weights.items():
        np.testing.assert_allclose(np.array(parameters[key]), value, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "name", ["jamba", "nemotron_h", "rwkv7", "mamba", "openelm", "nemotron-nas"]
)
def test_memory_estimate_reads_hybrid_and_attention_free_gguf(tmp_path, name):
    """Per-layer metadata arrays survive the header read that skips the vocabulary, and a
    family without attention needs no head counts."""
    family = FAMILIES[name]
    path = write_converted_gguf(tmp_path / "m.gguf", family, make_reference(family.config)[1])
    inventory = read_model_inventory(path)
    assert inventory.architecture.num_layers == family.config["num_hidden_layers"]
    assert inventory.config["model_type"] == family.config["model_type"]


@pytest.mark.parametrize(
    ("name", "matrix_type"),
    [
        ("llama", "Q8_0"),
        ("mixtral", "Q4_0"),
        ("qwen2_moe", "Q5_1"),
        ("gpt_oss", "MXFP4"),
        ("deepseek_v3", "Q8_0"),
        ("internlm2", "Q8_0"),
        ("gpt_neox", "Q4_0"),
        ("nemotron_h", "Q8_0"),
        ("nemotron-nas", "Q8_0"),
        ("bailing_moe2", "Q8_0"),
        ("gemma4_text_experts", "Q4_0"),
        ("gemma3n", "Q8_0"),
        # Qwen3.5's value heads are reordered on the packed rows and, a head being whole
        # groups, on the packed columns of `ssm_out`.
        ("qwen3_5", "Q8_0"),
        ("qwen3_5_moe", "Q4_0"),
    ],
)
def test_quantized_gguf_matches_mlx_lm_on_the_values_it_stores(tmp_path, name, matrix_type):
    family = FAMILIES[name]
    _, weights = make_reference(family.config)
    path = write_converted_gguf(tmp_path / "m.gguf", family, weights, matrix_type)
    reference = make_reference(family.config)[0]
    stored = stored_weights(weights, matrix_type)
    reference.load_weights([(k, mx.array(v)) for k, v in stored.items()], strict=True)
    loaded = load(path)
    assert {c.type_name for c in loaded.conversions} == {"F32", matrix_type}
    tokens = mx.array([PROMPT])
    np.testing.assert_allclose(
        np.array(loaded.module(tokens)), np.array(reference(tokens)), atol=2e-3, rtol=2e-3
    )
    assert greedy_tokens(loaded.module) == greedy_tokens(reference)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_latent_attention_regroups_whole_and_split_kv_b_alike(model_type):
    config = {"model_type": model_type, "num_attention_heads": 4, "qk_nope_head_dim": 16}
    kv_b = np.random.default_rng(0).standard_normal((4 * (16 + 8), 32)).astype(np.float32)
    split = dict(split_kv_b("kv_b_proj.weight", kv_b, config))
    from_whole = latent_attention_weights({"attn_kv_b.weight": mx.array(kv_b)}, config)
    halves = {"attn_k_b.weight": mx.array(split["k_b_proj.weight"])}
    assert latent_attention_weights(halves, config) is None
    halves["attn_v_b.weight"] = mx.array(split["v_b_proj.weight"])
    from_split = latent_attention_weights(halves, config)
    assert from_whole.keys() == from_split.keys()
    for key in from_whole:
        np.testing.assert_array_equal(np.array(from_whole[key]), np.array(from_split[key]))
    if model_type == "deepseek_v2":
        np.testing.assert_array_equal(np.array(from_split["self_attn.kv_b_proj.weight"]), kv_b)


def documented_architectures() -> list[tuple[str, str]]:
    """(architecture, what it loads as or why not) rows of the models doc's table."""
    section = MODELS_DOC.read_text().split("### GGUF architectures\n", 1)[1]
    section = re.split(r"^#", section, maxsplit=1, flags=re.MULTILINE)[0]
    return re.findall(r"^\| `([^`]+)` \| (.+) \|$", section, flags=re.MULTILINE)


def test_models_doc_lists_every_gguf_architecture_as_the_loader_maps_it():
    rows = documented_architectures()
    names = [name for name, _ in rows]
    assert names == sorted(set(names))
    assert set(names) == set(gguf.MODEL_ARCH_NAMES.values())
    for name, cell in rows:
        arch = GGUF_ARCHITECTURES.get(name)
        if arch is None:
            assert not cell.startswith("`"), f"{name} is documented as loading"
            continue
        assert cell.startswith(f"`{arch.model_type}`"), name
        for model_type in (arch.moe_model_type, *arch.other_model_types):
            assert model_type is None or f"`{model_type}`" in cell, name
