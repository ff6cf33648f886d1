"""Memory estimates from headers: weights, KV bytes per token and the budget, checked
against counts made from the tiny models' configs and against what loading really holds."""

import json
import struct

import mlx.core as mx
import mlx.nn as nn
import pytest
from family_configs import write_family_model
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model as mlx_lm_load_model

import mlxcel_core.engine.config as engine_config_module
from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.cache.quant import CACHE_TYPES, CacheTypeError
from mlxcel_core.engine import EngineConfig, SchedulerConfig
from mlxcel_core.engine.memory import (
    MEASUREMENT_SLACK_BYTES,
    ModelProfile,
    measure_pass,
    profile_model,
    trace_cache_geometry,
)
from mlxcel_core.kernels import CUDA
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.errors import ModelLoadError
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.loading.loader import load_model
from mlxcel_models.memory import (
    ContextRequest,
    MemoryBudget,
    estimate_memory,
    estimate_weights,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_layers,
    read_model_inventory,
)
from mlxcel_models.mlx_lm_models import make_mlx_lm_model

from factories import TinyConfig, byte_level_vocab, write_gguf_model, write_safetensors_model

GPU_LIKE = ComputeOptions()  # what Metal and CUDA use: the file's dtypes, quantized kept
CPU_DENSE = ComputeOptions(float_dtype=mx.float32, dense_weights_max_bytes=2**40)
CPU_QUANTIZED = ComputeOptions(float_dtype=mx.float32, dequantize_min_rows=4,
                               dense_weights_max_bytes=0)  # fmt: skip
# head dim 32: every cache type can store it.
WIDE_HEADS = TinyConfig(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=96)


def parameter_counts(config: TinyConfig) -> tuple[int, int]:
    """(matrix values, norm values) of a tiny llama with tied embeddings."""
    D, F = config.hidden_size, config.intermediate_size
    kv_rows = config.num_kv_heads * config.head_dim
    vocab = len(byte_level_vocab()[0])
    per_layer = D * D + 2 * kv_rows * D + D * D + 3 * D * F
    return vocab * D + config.num_layers * per_layer, D + 2 * D * config.num_layers


@pytest.mark.parametrize(("matrix_type", "bits"), [("Q8_0", 8), ("Q4_1", 4), ("Q4_0", 4)])
def test_gguf_weights_follow_the_devices_compute_options(tmp_path, matrix_type, bits):
    path = write_gguf_model(tmp_path / "tiny.gguf", WIDE_HEADS, matrix_type)
    inventory = read_model_inventory(path)
    matrices, norms = parameter_counts(WIDE_HEADS)
    groups = matrices // 32
    expected = {
        # codes, then a float16 scale and bias per 32 values; float32 norms
        GPU_LIKE: matrices * bits // 8 + 2 * groups * 2 + norms * 4,
        CPU_DENSE: (matrices + norms) * 4,
        CPU_QUANTIZED: matrices * bits // 8 + 2 * groups * 4 + norms * 4,
    }
    for options, resident in expected.items():
        estimate = estimate_weights(inventory, options)
        assert estimate.num_parameters == matrices + norms
        assert estimate.resident_bytes == resident
        assert estimate.dense == (options is CPU_DENSE)
        loaded = load_model(path, compute=options)
        assert loaded.config.weight_bytes == resident
        assert loaded.config.num_parameters == matrices + norms
    assert estimate_weights(inventory, GPU_LIKE).file_bytes == path.stat().st_size


def test_safetensors_weights_skip_the_tied_head_and_keep_float32(tmp_path):
    folder = write_safetensors_model(tmp_path / "hf", WIDE_HEADS)
    inventory = read_model_inventory(folder)
    matrices, norms = parameter_counts(WIDE_HEADS)
    for options in (GPU_LIKE, CPU_DENSE):
        estimate = estimate_weights(inventory, options)
        assert estimate.resident_bytes == (matrices + norms) * 4
        assert load_model(folder, compute=options).config.weight_bytes == estimate.resident_bytes
    arch = inventory.architecture
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (2, 2, 32)
    assert arch.context_length == WIDE_HEADS.context_length


def test_mlx_lm_quantized_folders_count_codes_scales_and_biases(tmp_path):
    folder = write_safetensors_model(tmp_path / "hf", WIDE_HEADS)
    module, config = mlx_lm_load_model(folder)
    nn.quantize(module, group_size=32, bits=4)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(module.parameters())))
    config["quantization"] = {"group_size": 32, "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    inventory = read_model_inventory(folder)
    matrices, norms = parameter_counts(WIDE_HEADS)
    groups = matrices // 32
    expected = {  # the folder's scales and biases are float32
        GPU_LIKE: matrices // 2 + 2 * groups * 4 + norms * 4,
        CPU_DENSE: (matrices + norms) * 4,
    }
    for options, resident in expected.items():
        assert estimate_weights(inventory, options).resident_bytes == resident
        assert load_model(folder, compute=options).config.weight_bytes == resident
    assert {t.stored_type for t in inventory.tensors} == {"4-bit", "F32"}


@pytest.mark.parametrize("options", [GPU_LIKE, CPU_DENSE])
def test_kv_geometry_matches_the_engines_profiling_pass(tiny_gguf, options):
    layers = kv_layers(read_model_inventory(tiny_gguf), options)
    profile = profile_model(load_model(tiny_gguf, compute=options).model, 4)
    assert layers == profile.layers


def test_a_model_with_layers_without_attention_counts_the_caches_it_keeps(tmp_path):
    # The tiny Nemotron-NAS's middle layer has no attention: mlx-lm keeps two caches.
    folder = write_family_model(tmp_path / "nas", "nemotron-nas")
    options = ComputeOptions(mx.float32)
    layers = kv_layers(read_model_inventory(folder), options)
    profile = profile_model(load_model(folder, compute=options).model, 4)
    assert len(layers) == 2 and layers == profile.layers


def test_a_bfloat16_folder_keeps_bfloat16_keys_where_the_files_dtypes_are_kept(tmp_path):
    folder = write_safetensors_model(tmp_path / "hf", WIDE_HEADS)
    weights = mx.load(str(folder / "model.safetensors"))
    bf16 = {name: array.astype(mx.bfloat16) for name, array in weights.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), bf16)
    inventory = read_model_inventory(folder)
    for options, dtype in ((GPU_LIKE, mx.bfloat16), (CPU_DENSE, mx.float32)):
        layers = kv_layers(inventory, options)
        assert layers[0].dtype == dtype
        assert layers == profile_model(load_model(folder, compute=options).model, 4).layers
    matrices, norms = parameter_counts(WIDE_HEADS)
    assert estimate_weights(inventory, GPU_LIKE).resident_bytes == (matrices + norms) * 2


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_kv_bytes_per_token_match_the_pools_the_engine_allocates(tmp_path, cache_type):
    path = write_gguf_model(tmp_path / "tiny.gguf", WIDE_HEADS)
    layers = kv_layers(read_model_inventory(path), CPU_DENSE)
    per_token = kv_bytes_per_token(layers, cache_type, cache_type)
    storage = PagedKVStorage(layers, 16, 64, cache_type_k=cache_type, cache_type_v=cache_type)
    storage.ensure_capacity(3)
    measured = sum(array.nbytes for array in storage.arrays())
    assert measured == storage.capacity_blocks[0] * 16 * per_token
    # TurboQuant: b bits per coordinate, a float16 norm, and one outlier feature kept apart
    # (a uint8 position and its float16 value) per 32-wide vector.
    expected_vector = {"auto": 128, "f32": 128, "f16": 64, "bf16": 64, "q8_0": 34,
                       "q4_0": 18, "turbo2": 13, "turbo3": 17, "turbo4": 21}  # fmt: skip
    assert per_token == 2 * 2 * 2 * expected_vector[cache_type]  # layers x heads x (K + V)


def test_a_cache_type_the_head_dim_cannot_take_is_refused(tiny_gguf):
    layers = kv_layers(read_model_inventory(tiny_gguf), CPU_DENSE)  # head dim 16
    with pytest.raises(CacheTypeError, match="multiple of 32"):
        kv_bytes_per_token(layers, "q8_0", "auto")


def test_one_context_counts_the_engines_blocks_and_the_trained_context_for_zero(tiny_gguf):
    inventory = read_model_inventory(tiny_gguf)
    assert kv_cache_bytes(512, 100, 16) == (7 + 1) * 16 * 512
    assert kv_cache_bytes(512, 100, 16, num_sequences=4) == (28 + 1) * 16 * 512
    estimate = estimate_memory(inventory, ContextRequest(context_size=0), CPU_DENSE)
    assert estimate.kv_cache == kv_cache_bytes(512, 256, 16)  # trained context: 256
    assert estimate.weights == estimate_weights(inventory, CPU_DENSE).resident_bytes
    longer = estimate_memory(inventory, ContextRequest(context_size=4096), CPU_DENSE)
    assert longer.activations > estimate.activations and longer.total > estimate.total


@pytest.mark.parametrize(
    ("cache_type_k", "cache_type_v", "residual", "expected"),
    [
        # float16 copies of 2 layers x 2 heads x (32 key + 32 value features), for a window
        # of 16 in blocks of 16: the 2 blocks it can touch, twice, and the null block.
        ("q8_0", "q8_0", None, 5 * 16 * 2 * 2 * 64 * 2),
        ("q4_0", "f16", None, 5 * 16 * 2 * 2 * 32 * 2),  # the keys only
        ("turbo4", "turbo4", 32, 7 * 16 * 2 * 2 * 64 * 2),  # 3 blocks, twice, and the null
        ("q8_0", "q8_0", 0, 0),
        ("f16", "f16", None, 0),
        ("auto", "auto", None, 0),
    ],
)
def test_a_residual_window_counts_the_exact_copies_the_engine_sets_aside(
    tmp_path, cache_type_k, cache_type_v, residual, expected
):
    inventory = read_model_inventory(write_gguf_model(tmp_path / "tiny.gguf", WIDE_HEADS))
    types = {"cache_type_k": cache_type_k, "cache_type_v": cache_type_v}
    request = ContextRequest(1000, cache_residual=residual, **types)
    estimate = estimate_memory(inventory, request, CPU_DENSE)
    assert estimate.residual == expected
    assert estimate.total == (
        estimate.weights + estimate.kv_cache + estimate.residual + estimate.activations
    )
    engine = EngineConfig(
        SchedulerConfig(max_num_seqs=1), context_size=1000, cache_residual=residual, **types
    )
    assert request.cache_residual == engine.cache_residual
    profile = ModelProfile(kv_layers(inventory, CPU_DENSE), 0, 0, vocab_size=1)
    assert estimate.residual == engine.residual_bytes(profile)


def test_the_residual_window_resolves_and_is_checked_as_the_engine_does(monkeypatch):
    assert ContextRequest(100, cache_type_k="turbo4", cache_type_v="turbo4").cache_residual == 16
    # Where a kernel decodes TurboQuant keys and values from their codes, no window.
    monkeypatch.setattr(engine_config_module, "kernel_backend", lambda device: CUDA)
    assert ContextRequest(100, cache_type_k="turbo4", cache_type_v="turbo4").cache_residual == 0
    assert ContextRequest(100, cache_type_k="q8_0", cache_type_v="turbo4").cache_residual == 16
    with pytest.raises(ValueError, match=r"^cache_residual must be >= 0, got -1"):
        ContextRequest(100, cache_type_k="q8_0", cache_residual=-1)
    with pytest.raises(ValueError, match=r"^cache_residual keeps exact copies .* needs"):
        ContextRequest(100, cache_type_k="f16", cache_residual=16)


def test_missing_and_corrupt_models_are_model_load_errors(tmp_path, tiny_gguf):
    with pytest.raises(ModelLoadError, match="model not found"):
        read_model_inventory(tmp_path / "absent.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_gguf.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="corrupt or truncated GGUF header"):
        read_model_inventory(truncated)
    folder = write_safetensors_model(tmp_path / "hf")
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 50) + b"{not json")
    with pytest.raises(ModelLoadError, match="corrupt or truncated safetensors header"):
        read_model_inventory(folder)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # The first 8 bytes read as a header length of about 7.9e18 bytes.
        (b"this is not safetensors", "corrupt or truncated safetensors header"),
        (struct.pack("<Q", 100) + b"{}", "corrupt or truncated safetensors header"),
        (struct.pack("<Q", 2) + b"[]", "the safetensors header is not a JSON object"),
    ],
    ids=["garbage", "length-beyond-the-file", "json-array"],
)
def test_a_corrupt_safetensors_header_is_named(tmp_path, content, message):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(ModelLoadError, match=rf"model\.safetensors: {message}"):
        read_model_inventory(tmp_path)


def test_the_budget_is_the_engines_share_capped_by_what_is_available():
    assert MemoryBudget(100, 1000, 0.9).usable_bytes == 90
    assert MemoryBudget(100, 50, 0.9).usable_bytes == 50
    with pytest.raises(ValueError, match=r"utilization must be in \(0, 1\]"):
        MemoryBudget(100, 50, 1.5)


@pytest.mark.parametrize("options", [GPU_LIKE, CPU_DENSE, CPU_QUANTIZED])
@pytest.mark.parametrize("chunk", [64, 512])
def test_the_step_scaled_from_small_passes_covers_a_measured_pass_of_the_chunk(
    tiny_gguf, options, chunk
):
    model = load_model(tiny_gguf, compute=options).model
    scaled = profile_model(model, chunk).transient_bytes
    measured = measure_pass(model, chunk).transient_bytes
    assert measured <= scaled
    if chunk == 64:
        # Above by at most the headroom and the fixed slack. At 512 tokens this model's
        # attention scores dominate, counted as three arrays where MLX keeps fewer alive.
        assert scaled <= 2.5 * measured + MEASUREMENT_SLACK_BYTES


def test_tracing_a_models_caches_evaluates_none_of_its_weights():
    """The memory check reads what a model's caches hold before loading it: its module,
    built from the config with lazy random weights, is traced, never evaluated."""
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 32768,  # 2 layers x 3 x 256 x 32768 float32 values: 192 MiB
        "vocab_size": 1024,
        "rms_norm_eps": 1e-5,
    }
    module = make_mlx_lm_model(config, where="config.json")
    mx.synchronize()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    _, geometry = trace_cache_geometry(MlxLmLanguageModel.for_tracing(module), 1)
    assert len(geometry.layers) == 2 and geometry.layers[0].num_kv_heads == 2
    assert mx.get_peak_memory() - before < 2**20
