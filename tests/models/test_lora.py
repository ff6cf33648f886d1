"""LoRA adapters on the tiny float32 llama: both folder layouts, unfused and fused, strict
loading, and per-row scales in the batching engine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import mlx.nn as nn
import numpy as np
import pytest

from mlxcel_core.engine import Engine, EngineConfig, EngineRequest, OutputQueue, SchedulerConfig
from mlxcel_core.generate import stream_generate
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import Sampler, SamplingParams
from mlxcel_models.attach_lora import apply_adapters
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.loading.loader import load_model
from mlxcel_models.lora import AdapterFormat, AdapterLoadError, AdapterScaleError, AdapterSpec
from mlxcel_models.lora.layer import input_dims

from adapter_factories import (
    lora_updates,
    random_updates,
    write_mlx_lm_adapter,
    write_peft_adapter,
)

PROMPT = (40, 41, 42, 43, 44, 45, 46, 47, 48)
GREEDY = SamplingParams(temperature=0.0)
GENERATION = GenerationConfig(context_size=64, max_tokens=12)
TIMEOUT = 30.0


class NullDetokenizer:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


def greedy_tokens(loaded: LoadedModel, prompt: Sequence[int] = PROMPT) -> list[int]:
    chunks = stream_generate(
        loaded.model,
        prompt,
        Sampler(GREEDY),
        NullDetokenizer(),
        GENERATION,
        adapters=loaded.row_adapters,
    )
    return [chunk.token_id for chunk in chunks if chunk.token_id is not None]


@pytest.fixture(scope="module")
def mlx_lm_adapter(tmp_path_factory) -> Path:
    return write_mlx_lm_adapter(tmp_path_factory.mktemp("lora") / "mlx", lora_updates(), 2.0)


@pytest.fixture(scope="module")
def peft_adapter(tmp_path_factory) -> Path:
    # alpha / r = 16 / 8 = 2.0, the mlx-lm adapter's scale.
    folder = tmp_path_factory.mktemp("lora") / "peft"
    return write_peft_adapter(folder, lora_updates(), lora_alpha=16)


@pytest.fixture(scope="module")
def base_tokens(tiny_safetensors) -> list[int]:
    return greedy_tokens(load_model(tiny_safetensors))


def with_adapters(path: Path, specs: Sequence[AdapterSpec], *, fuse: bool = False) -> LoadedModel:
    return apply_adapters(load_model(path), specs, fuse=fuse)


def test_an_mlx_lm_adapter_changes_greedy_output_and_scale_zero_restores_it(
    tiny_safetensors, mlx_lm_adapter, base_tokens
):
    loaded = with_adapters(tiny_safetensors, [AdapterSpec(str(mlx_lm_adapter))])
    assert loaded.adapters.infos[0].format is AdapterFormat.MLX_LM
    assert loaded.adapters.infos[0].num_layers == 6
    adapted = greedy_tokens(loaded)
    assert adapted != base_tokens
    loaded.adapters.set_global_scales((0.0,))
    assert greedy_tokens(loaded) == base_tokens
    loaded.adapters.set_global_scales((1.0,))
    assert greedy_tokens(loaded) == adapted


def test_a_peft_adapter_gives_the_tokens_of_the_same_mlx_lm_adapter(
    tiny_safetensors, mlx_lm_adapter, peft_adapter, base_tokens
):
    peft = with_adapters(tiny_safetensors, [AdapterSpec(str(peft_adapter), 0.5)])
    mlx_lm = with_adapters(tiny_safetensors, [AdapterSpec(str(mlx_lm_adapter), 0.5)])
    assert peft.adapters.infos[0].format is AdapterFormat.PEFT
    assert greedy_tokens(peft) == greedy_tokens(mlx_lm) != base_tokens


def test_rslora_scales_by_alpha_over_the_square_root_of_the_rank(tmp_path, tiny_safetensors):
    updates = lora_updates()
    # alpha / sqrt(8) == 2.0: the same update as an mlx-lm scale of 2.0.
    rslora = write_peft_adapter(
        tmp_path / "rs", updates, lora_alpha=2.0 * math.sqrt(8), use_rslora=True
    )
    mlx_lm = write_mlx_lm_adapter(tmp_path / "mlx", updates, 2.0)
    assert greedy_tokens(with_adapters(tiny_safetensors, [AdapterSpec(str(rslora))])) == (
        greedy_tokens(with_adapters(tiny_safetensors, [AdapterSpec(str(mlx_lm))]))
    )


def test_fused_and_unfused_adapters_give_the_same_tokens(
    tiny_safetensors, mlx_lm_adapter, peft_adapter, base_tokens
):
    specs = [AdapterSpec(str(mlx_lm_adapter), 0.7), AdapterSpec(str(peft_adapter), -0.4)]
    unfused = with_adapters(tiny_safetensors, specs)
    fused = with_adapters(tiny_safetensors, specs, fuse=True)
    assert fused.adapters.fused and fused.row_adapters is None
    assert greedy_tokens(fused) == greedy_tokens(unfused) != base_tokens
    with pytest.raises(AdapterScaleError, match="fused into the weights"):
        fused.adapters.set_global_scales((1.0, 1.0))


def bad_adapter(folder: Path, edit) -> Path:
    updates = lora_updates()
    edit(updates)
    return write_mlx_lm_adapter(folder, updates, 1.0)


def test_an_update_with_a_wrong_input_dimension_fails_naming_the_tensor(tmp_path, tiny_safetensors):
    name = "model.layers.1.mlp.down_proj.lora_a"

    def widen(updates):
        updates[name] = np.zeros((129, 8), np.float32)

    folder = bad_adapter(tmp_path / "wide", widen)
    with pytest.raises(AdapterLoadError, match=rf"{name} has shape \(129, 8\).*128 inputs"):
        with_adapters(tiny_safetensors, [AdapterSpec(str(folder))])


def test_a_tensor_matching_no_layer_fails_naming_it(tmp_path, tiny_safetensors):
    def add_unknown(updates):
        updates["model.layers.0.self_attn.x_proj.lora_a"] = np.zeros((64, 8), np.float32)
        updates["model.layers.0.self_attn.x_proj.lora_b"] = np.zeros((8, 64), np.float32)

    folder = bad_adapter(tmp_path / "unknown", add_unknown)
    with pytest.raises(AdapterLoadError, match=r"x_proj.lora_a matches no linear layer"):
        with_adapters(tiny_safetensors, [AdapterSpec(str(folder))])


def test_a_tensor_that_is_not_a_lora_tensor_fails_naming_it(tmp_path, tiny_safetensors):
    def add_bias(updates):
        updates["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)

    folder = bad_adapter(tmp_path / "bias", add_bias)
    with pytest.raises(AdapterLoadError, match=r"q_proj.bias is not a LoRA tensor"):
        with_adapters(tiny_safetensors, [AdapterSpec(str(folder))])


def test_a_missing_adapter_path_fails_naming_it(tmp_path, tiny_safetensors):
    missing = tmp_path / "no-such-adapter"
    with pytest.raises(AdapterLoadError, match=f"{missing}: no such folder"):
        with_adapters(tiny_safetensors, [AdapterSpec(str(missing))])


def test_scales_follow_llama_server_semantics(tiny_safetensors, mlx_lm_adapter, peft_adapter):
    specs = [AdapterSpec(str(mlx_lm_adapter)), AdapterSpec(str(peft_adapter), 0.5)]
    adapters = with_adapters(tiny_safetensors, specs).adapters
    assert adapters.global_scales == (1.0, 0.5)
    assert adapters.scales_from({1: 2.0}) == (0.0, 2.0)
    assert adapters.resolve_scales(None) == (1.0, 0.5)
    with pytest.raises(AdapterScaleError, match=r"adapter id must be in \[0, 1\], got 2"):
        adapters.scales_from({2: 1.0})


def run_engine(engine: Engine, groups: Sequence[Sequence[EngineRequest]]) -> list:
    """Submit each group after the one before finished; every request's outputs, in order."""
    results = []
    for requests in groups:
        sink = OutputQueue()
        engine.submit(requests, sink)
        outputs, finished = [], 0
        while finished < len(requests):
            output = sink.get(timeout=TIMEOUT)
            outputs.append(output)
            finished += output.finished
        results += [[o for o in outputs if o.index == r.index] for r in requests]
    return results


def request(index: int, scales: tuple[float, ...] | None) -> EngineRequest:
    return EngineRequest(
        PROMPT, GREEDY, GENERATION, NullDetokenizer(), index=index, adapter_scales=scales
    )


def test_the_engine_applies_each_rows_scales_and_keeps_their_kv_apart(
    tiny_safetensors, mlx_lm_adapter, base_tokens
):
    loaded = with_adapters(tiny_safetensors, [AdapterSpec(str(mlx_lm_adapter))])
    adapted = greedy_tokens(loaded)
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
        context_size=64,
        block_size=4,
        num_kv_blocks=64,
    )
    engine = Engine(loaded.model, config, adapters=loaded.row_adapters)
    try:
        # One batch mixing settings (later choices of a prompt fork only from a first choice
        # of the same setting), then one request per setting after the cache holds both.
        mixed = [request(0, (0.0,)), request(1, None), request(2, (0.0,)), request(3, (1.0,))]
        results = run_engine(engine, [mixed, [request(0, (0.0,))], [request(0, None)]])
    finally:
        engine.shutdown(timeout=TIMEOUT)
    tokens = [[o.token_id for o in outputs if o.token_id is not None] for outputs in results]
    assert tokens == [base_tokens, adapted, base_tokens, adapted, base_tokens, adapted]
    cached = [outputs[-1].stats.cached_tokens for outputs in results[4:]]
    assert cached == [8, 8]


def test_adapters_on_quantized_layers_change_the_output_and_fuse(tiny_gguf, tmp_path):
    quantized = load_model(tiny_gguf, compute=ComputeOptions())
    assert isinstance(quantized.model.module.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    base = greedy_tokens(quantized)
    folder = write_mlx_lm_adapter(tmp_path / "a", lora_updates(), 2.0)
    loaded = apply_adapters(quantized, [AdapterSpec(str(folder))])
    assert greedy_tokens(loaded) != base
    loaded.adapters.set_global_scales((0.0,))
    assert greedy_tokens(loaded) == base
    fused = apply_adapters(
        load_model(tiny_gguf, compute=ComputeOptions()), [AdapterSpec(str(folder))], fuse=True
    )
    assert isinstance(fused.model.module.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    assert greedy_tokens(fused) != base


@pytest.mark.slow
def test_a_rank_8_adapter_changes_smollm2_and_scale_zero_restores_it(smollm2_path, tmp_path):
    loaded = load_model(smollm2_path)
    tokenizer = loaded.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.encode_chat(messages)
    base = greedy_tokens(loaded, prompt)
    assert tokenizer.decode(base).startswith("The capital of France is Paris")
    shapes = {
        name: (input_dims(layer), layer.weight.shape[0])
        for name, layer in loaded.model.module.named_modules()
        if name.endswith(("self_attn.q_proj", "self_attn.v_proj"))
    }
    assert len(shapes) == 60
    folder = write_mlx_lm_adapter(tmp_path / "smollm2", random_updates(shapes, rank=8), 2.0)
    adapted = apply_adapters(loaded, [AdapterSpec(str(folder))])
    assert greedy_tokens(adapted, prompt) != base
    adapted.adapters.set_global_scales((0.0,))
    assert greedy_tokens(adapted, prompt) == base
