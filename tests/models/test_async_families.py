"""Async scheduling against the synchronous loop on families the engine runs one row per
pass (`ONE_CONTEXT_PER_PASS`: `batches_rows` False, each cache's `offset` one integer).

Tiny random-weight models of the families (`family_configs`), loaded through mlxcel's
loader, step an `EngineCore` with async scheduling on and off (`engine_core_runs`): each
request's outputs must match token by token while decode rows take their pending tokens on
the device one pass per row. Llama 4's configuration attends within chunks of 4 positions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from family_configs import write_family_model
from family_overrides import VOCAB_SIZE

from mlxcel_core.engine import RequestCancelledError
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.loading.loader import load_model

from engine_core_runs import Arrival, assert_same_outputs, prompt, request


@pytest.mark.parametrize("model_type", ["gemma2", "llama4"])
def test_one_context_per_pass_families_give_the_same_tokens(model_type: str, tmp_path: Path):
    model = load_model(write_family_model(tmp_path / model_type, model_type)).model
    assert not model.batches_rows

    def tokens(first: int, length: int) -> list[int]:
        return prompt(first, length, VOCAB_SIZE)

    sampled = SamplingParams(temperature=0.9, seed=4)
    arrivals = [
        Arrival((request(tokens(1, 13), max_tokens=16),)),
        Arrival((request(tokens(2, 6), sampling=sampled, max_tokens=12),)),
        Arrival(
            tuple(request(tokens(3, 9), sampling=sampled, index=i, max_tokens=8) for i in (0, 1)),
            at_step=2,
        ),
        Arrival((request(tokens(4, 5), max_tokens=30),), at_step=3, cancel_at_step=7),
    ]
    for result in assert_same_outputs(model, arrivals):
        assert isinstance(result.outputs[300][-1].error, RequestCancelledError)
        assert result.outputs[201][-1].stats.cached_tokens == 8  # forked from choice 0
