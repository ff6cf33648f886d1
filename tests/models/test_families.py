"""Families come from mlx-lm's own modules, and say what each supports.

Tiny folders of real families (`family_configs`) check the parts that read a model: a
family whose cache has no kind in the engine is refused in one line, `--tp` on a family
that cannot shard is a usage error, and the memory preflight sizes each layer's KV as the
engine's profiling pass records it (a latent "head" for multi-head latent attention).
"""

from __future__ import annotations

import pkgutil

import mlx.core as mx
import mlx_lm.models
import pytest
from family_configs import write_family_model
from mlx_lm.utils import MODEL_REMAPPING

from mlxcel.common.flags import UsageError
from mlxcel.distributed.parallel_modes import TENSOR_PARALLEL
from mlxcel_core.cache.layout import CacheKind
from mlxcel_core.cache.state import state_bytes_per_sequence
from mlxcel_core.engine.memory import profile_model
from mlxcel_models.cache_kinds import UnsupportedCacheError
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architectures import gguf_model_types
from mlxcel_models.loading.loader import load_model
from mlxcel_models.memory import ContextRequest, estimate_memory, kv_layers, read_model_inventory
from mlxcel_models.metadata import ModelKind, WeightFormat, all_families, family_for
from mlxcel_models.mlx_lm_families import VISION_LANGUAGE, mlx_lm_text_families

HELPERS = {"activations", "base", "bitlinear_layers", "cache", "gated_delta", "mla",
           "pipeline", "rope_utils", "ssm", "switch_layers"}  # fmt: skip


def test_every_mlx_lm_text_module_and_alias_is_a_family():
    modules = {info.name for info in pkgutil.iter_modules(mlx_lm.models.__path__)}
    families = mlx_lm_text_families()
    assert set(families.values()) == modules - HELPERS - set(VISION_LANGUAGE)
    for alias, module in MODEL_REMAPPING.items():
        assert families.get(alias) == (module if module in families.values() else None)
    assert families["mistral"] == "llama" and families["kimi_k2"] == "deepseek_v3"


def test_text_families_say_what_their_layers_keep():
    families = all_families()
    assert families["llama"].cache_kinds == {CacheKind.ATTENTION, CacheKind.SLIDING_WINDOW}
    assert families["deepseek_v3"].cache_kinds == {CacheKind.ATTENTION}
    assert families["mamba"].cache_kinds == {CacheKind.STATE}
    assert not families["mamba"].supports_paged_kv
    assert families["gemma3"].runs_in_engine and families["gpt_oss"].supports_prefix_caching
    hybrid = families["qwen3_next"]
    assert hybrid.cache_kinds == {CacheKind.STATE, CacheKind.ATTENTION}
    assert hybrid.runs_in_engine and hybrid.supports_paged_kv
    assert not (hybrid.supports_prefix_caching or hybrid.supports_speculative)
    assert not hybrid.supports_pipeline_parallel
    assert families["qwen2_vl"].kind is ModelKind.VLM


def test_gguf_formats_come_from_the_gguf_loaders_architectures():
    with_gguf = {name for name, f in all_families().items() if WeightFormat.GGUF in f.formats}
    assert with_gguf == gguf_model_types()
    assert {"llama", "mixtral", "gemma3_text", "gpt_oss"} <= with_gguf
    # A GGUF file names its architecture as llama.cpp does; those names are listed.
    message = r"unsupported GGUF architecture 'bloom'; supported: .*command-r.*gemma3.*gpt-oss"
    with pytest.raises(ModelLoadError, match=message) as refusal:
        family_for("bloom", WeightFormat.GGUF)
    assert "qwen2moe" in str(refusal.value)
    assert not {"gemma3_text", "gpt_oss", "qwen2_moe"} & set(str(refusal.value).split(", "))


def test_a_vision_language_module_is_not_a_text_family():
    with pytest.raises(ModelLoadError, match="unsupported model type 'pixtral'"):
        family_for("pixtral", WeightFormat.SAFETENSORS)


def test_a_family_whose_cache_has_no_kind_is_refused_in_one_line(tmp_path):
    folder = write_family_model(tmp_path / "deepseek_v41", "deepseek_v41")
    with pytest.raises(UnsupportedCacheError) as refused:
        load_model(folder)
    message = str(refused.value)
    assert "\n" not in message
    assert message.endswith(
        "mlxcel cannot run this deepseek_v41 model: layer 0 keeps a LayerCache, which "
        "mlxcel's engine has no cache kind for"
    )
    assert not all_families()["deepseek_v41"].runs_in_engine


def test_tensor_parallel_on_a_family_that_cannot_shard_is_a_usage_error(tmp_path):
    inventory = read_model_inventory(write_family_model(tmp_path / "gemma", "gemma"))
    with pytest.raises(UsageError, match=r"^--tp: the gemma family does not support tensor"):
        TENSOR_PARALLEL.check_model(inventory, 2)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3", "gemma3", "gpt2", "minicpm3"])
def test_the_preflight_sizes_kv_as_the_engine_records_it(model_type, tmp_path):
    folder = write_family_model(tmp_path / model_type, model_type)
    options = ComputeOptions(float_dtype=mx.float32)
    estimated = kv_layers(read_model_inventory(folder), options)
    profiled = profile_model(load_model(folder, compute=options).model, 4).layers
    assert estimated == profiled


def test_the_preflight_of_a_family_without_attention_counts_its_states(tmp_path):
    """Mamba's config has no head counts; its estimate holds no KV, and the state per
    sequence the engine's profiling pass records."""
    folder = write_family_model(tmp_path / "mamba", "mamba")
    options = ComputeOptions(float_dtype=mx.float32)
    estimate = estimate_memory(read_model_inventory(folder), ContextRequest(64), options)
    profile = profile_model(load_model(folder, compute=options).model, 4)
    assert profile.layers == () and estimate.kv_cache == 0
    assert estimate.states == state_bytes_per_sequence(profile.state_layers) > 0
