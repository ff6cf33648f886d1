"""GLM-5 (`glm-dsa`), Mistral 4 and BitNet GGUF files beyond the parity of
`test_gguf_architectures`: ternary blocks (TQ1_0, TQ2_0) repacked for BitLinear, and the
files whose model mlx-lm's family does not compute, refused in one line."""

import dataclasses

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_bitnet import pack_ternary
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.gguf_mla_variants import glm_dsa_config
from mlxcel_models.loading.gguf_model import load_gguf_model
from mlxcel_models.plain_kernels.bitlinear import unpack_ternary

from gguf_mla_families import MLA_GROUP_FAMILIES
from gguf_models import make_reference, stored_weights, tiny_config, write_converted_gguf

PROMPT = mx.array([[5, 80, 81, 200, 17, 42, 9, 260, 33, 7]])


def load(path):
    return load_gguf_model(path, read_gguf_header(path, arrays=True))


def with_metadata(name: str, **metadata):
    family = MLA_GROUP_FAMILIES[name]
    return dataclasses.replace(family, metadata=family.metadata | metadata)


@pytest.mark.parametrize("matrix_type", ["TQ1_0", "TQ2_0"])
def test_bitnet_ternary_blocks_load_as_the_bitlinear_weights_they_store(tmp_path, matrix_type):
    # Rows of whole 256-value ternary blocks.
    config = tiny_config(
        "bitnet", hidden_size=256, intermediate_size=512, head_dim=64, tie_word_embeddings=True
    )
    family = dataclasses.replace(MLA_GROUP_FAMILIES["bitnet"], config=config)
    reference, weights = make_reference(config)
    loaded = load(write_converted_gguf(tmp_path / "m.gguf", family, weights, matrix_type))
    assert {c.type_name for c in loaded.conversions} == {"F32", matrix_type}
    # The blocks keep each matrix's scale in float16.
    np.testing.assert_allclose(
        np.array(loaded.module(PROMPT)), np.array(reference(PROMPT)), atol=2e-3, rtol=2e-3
    )


def test_pack_ternary_gives_back_the_matrix_bitlinear_unpacks():
    ternary = np.random.default_rng(0).integers(-1, 2, size=(8, 16)).astype(np.float32)
    packed, scale = pack_ternary(mx.array(ternary * 0.25))
    assert packed.dtype == mx.uint8 and packed.shape == (2, 16)
    assert scale.item() == 0.25
    np.testing.assert_array_equal(np.array(unpack_ternary(packed, 8)), ternary)


def test_bitnet_matrix_with_more_than_three_values_is_refused(tmp_path):
    family = MLA_GROUP_FAMILIES["bitnet"]
    _, weights = make_reference(family.config)
    spoiled = dataclasses.replace(
        family,
        merge_tensors=lambda w: {
            name: value + (0.3 if name.endswith("q_proj.weight") else 0)
            for name, value in family.merge_tensors(w).items()
        },
    )
    with pytest.raises(ModelLoadError, match=r"attn_q.weight .*not ternary"):
        load(write_converted_gguf(tmp_path / "m.gguf", spoiled, weights))


def test_bitnet_file_with_silu_mlp_is_refused(tmp_path):
    family = MLA_GROUP_FAMILIES["bitnet"]
    silu = dataclasses.replace(
        family, metadata={k: v for k, v in family.metadata.items() if k != "hidden_activation"}
    )
    with pytest.raises(ModelLoadError, match=r"hidden_activation is none \(llama.cpp runs SiLU\)"):
        load(write_converted_gguf(tmp_path / "m.gguf", silu, make_reference(family.config)[1]))


@pytest.mark.parametrize(
    ("name", "metadata", "message"),
    [
        (
            "glm_moe_dsa",
            {"expert_gating_func": gguf.ExpertGatingFuncType.SOFTMAX},
            "sigmoid scores only",
        ),
        # GLM-5.2's context without the indexer types: llama.cpp's shared-indexer layers.
        ("glm_moe_dsa", {"context_length": 1 << 20}, "is GLM-5.2"),
        (
            "mistral4",
            {"expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID},
            "softmax scores only",
        ),
        ("mistral4", {"attn_temperature_length": 16}, "temperature_length \\(16\\) differs"),
    ],
)
def test_files_the_mlx_lm_family_does_not_compute_are_refused(tmp_path, name, metadata, message):
    family = with_metadata(name, **metadata)
    with pytest.raises(ModelLoadError, match=message):
        load(write_converted_gguf(tmp_path / "m.gguf", family, make_reference(family.config)[1]))


@pytest.mark.parametrize("name", ["glm_moe_dsa", "mistral4"])
def test_quantized_latent_files_match_mlx_lm_on_the_values_they_store(tmp_path, name):
    """The joined tensors (the latent `kv_b` halves, Mistral 4's fused experts) load from
    Q8_0 blocks as the values those blocks store."""
    family = MLA_GROUP_FAMILIES[name]
    reference, weights = make_reference(family.config)
    path = write_converted_gguf(tmp_path / "m.gguf", family, weights, "Q8_0")
    stored = stored_weights(weights, "Q8_0")
    reference.load_weights([(k, mx.array(v)) for k, v in stored.items()], strict=True)
    loaded = load(path)
    assert {c.type_name for c in loaded.conversions} == {"F32", "Q8_0"}
    np.testing.assert_allclose(
        np.array(loaded.module(PROMPT)), np.array(reference(PROMPT)), atol=2e-3, rtol=2e-3
    )


def test_glm_dsa_layers_sharing_an_indexer_are_refused():
    types = {"glm-dsa.attention.indexer.types": [True, False, True]}
    meta = GGUFMetadata(types, set(), "glm-dsa", where="m.gguf")
    with pytest.raises(ModelLoadError, match=r"layers \[1\] reuse"):
        glm_dsa_config(meta, {"max_position_embeddings": 256, "rope_theta": 1e4})


@pytest.mark.parametrize("name", ["glm_moe_dsa", "glm_moe_dsa_fused_experts", "mistral4"])
def test_latent_files_hold_the_checkpoint_weights(tmp_path, name):
    """Every joined or split tensor (the `kv_b` halves, fused experts, the indexer) lands on
    its parameter exactly."""
    family = MLA_GROUP_FAMILIES[name]
    _, weights = make_reference(family.config)
    loaded = load(write_converted_gguf(tmp_path / "m.gguf", family, weights))
    parameters = dict(tree_flatten(loaded.module.parameters()))
    assert parameters.keys() == weights.keys()
    for key, value in weights.items():
        np.testing.assert_array_equal(np.array(parameters[key]), value, err_msg=key)
