"""benchmarks/batched_decode.py's engine runs: KV cache types and a draft model reach the engine."""

from __future__ import annotations

import pytest

from mlxcel_core.speculative import SpeculativeConfig
from mlxcel_models.loading.loader import load_model

from benchmark_scripts import load_benchmark

random_model = load_benchmark("random_model")
batched_decode = load_benchmark("batched_decode")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tiny")
    random_model.write_random_model("tiny", folder, bits=None)
    return load_model(folder)


def test_quantized_kv_run_generates_every_token(tiny_model) -> None:
    prompts = batched_decode.random_prompts(2, 40, tiny_model.tokenizer.vocab_size)

    run = batched_decode.run_mlxcel(
        tiny_model, prompts, 6, cache_type_k="turbo4", cache_type_v="turbo4"
    )

    assert run.decode_tps > 0
    assert run.draft_tokens == 0


def test_model_drafting_for_itself_has_every_greedy_draft_accepted(tiny_model) -> None:
    prompts = batched_decode.random_prompts(2, 20, tiny_model.tokenizer.vocab_size)
    speculative = SpeculativeConfig(num_draft_tokens=3, draft_p_min=0.0)

    run = batched_decode.run_mlxcel(
        tiny_model, prompts, 12, draft=tiny_model, speculative=speculative
    )

    assert run.draft_tokens > 0
    assert run.accepted_draft_tokens == run.draft_tokens
