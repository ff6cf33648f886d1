"""Pipeline-parallel SmolLM2 on 2 and 3 real processes over the ring backend (loopback).

Each case starts pipeline_rank.py once per rank and compares rank 0's logits and greedy
tokens with one process running the unsplit model.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from ring_ranks import run_ranks, write_ring_hostfile

RANK_SCRIPT = Path(__file__).with_name("pipeline_rank.py")
NUM_MODEL_LAYERS = 30
TIMEOUT_SECONDS = 240

pytestmark = [pytest.mark.slow, pytest.mark.long]


def run_script(
    folder: Path, cache: str, ranks: list[dict[str, str]], *options: str
) -> dict[str, np.ndarray]:
    """Run pipeline_rank.py once per environment in `ranks`, together; rank 0's output."""
    folder.mkdir()
    output = folder / "out.npz"
    # Several processes share few cores here: one BLAS thread each, so none spins waiting.
    base = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    command = [sys.executable, str(RANK_SCRIPT), str(output), "--cache", cache, *options]
    run_ranks(command, [{**base, **extra} for extra in ranks], TIMEOUT_SECONDS)
    return dict(np.load(output))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """One process's results per cache kind, computed once."""
    results: dict[str, dict[str, np.ndarray]] = {}

    def get(cache: str) -> dict[str, np.ndarray]:
        if cache not in results:
            folder = tmp_path_factory.mktemp("reference") / cache
            results[cache] = run_script(folder, cache, [{}], "--reference")
        return results[cache]

    return get


@pytest.mark.parametrize(("num_ranks", "cache"), [(2, "dense"), (3, "dense"), (3, "paged")])
def test_pipeline_ranks_match_one_process(tmp_path, reference, num_ranks, cache):
    hostfile = write_ring_hostfile(tmp_path / "hosts.json", num_ranks)
    ranks = [{"MLX_RANK": str(r), "MLX_HOSTFILE": str(hostfile)} for r in range(num_ranks)]
    result = run_script(tmp_path / "run", cache, ranks)
    expected = reference(cache)

    np.testing.assert_array_equal(result["tokens"], expected["tokens"])
    np.testing.assert_allclose(result["step_logits"], expected["step_logits"], rtol=0, atol=1e-4)
    if cache == "dense":
        np.testing.assert_allclose(
            result["prefill_logits"], expected["prefill_logits"], rtol=0, atol=1e-4
        )

    facts = [
        json.loads((tmp_path / "run" / f"rank-{r}.json").read_text()) for r in range(num_ranks)
    ]
    layers = [range(*fact["layers"]) for fact in facts]
    assert [i for r in layers for i in r] == list(range(NUM_MODEL_LAYERS))
    for fact, owned in zip(facts, layers, strict=True):
        assert fact["num_caches"] == len(owned)
        if cache == "paged":
            assert fact["num_profiled_layers"] == len(owned)
        # The embedding is a fifth of SmolLM2's float32 weights; a rank that kept the
        # layers it does not run would hold all of them.
        share = len(owned) / NUM_MODEL_LAYERS + 0.25
        assert fact["memory_after"] < share * fact["memory_before"]
