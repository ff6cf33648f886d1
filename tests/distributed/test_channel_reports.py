"""The followers' reports reach rank 0 over real channels: one group of three processes over
the ring backend (loopback) runs a tensor-parallel channel, then a pipeline channel, with
messages of one frame and of two."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from ring_ranks import run_ranks, write_ring_hostfile

RANK_SCRIPT = Path(__file__).with_name("channel_rank.py")
NUM_RANKS = 3
TIMEOUT_SECONDS = 120


def _report(rank: int, step: int) -> list[float]:
    """What channel_rank.py's `report(rank, step)` reads back as."""
    return [step, pytest.approx(rank / 100 + step / 1000, abs=1e-6), 10**10 * rank + step]


@pytest.fixture(scope="module")
def received(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, list[float]]]]:
    """Rank 0's reports by step, over a tensor-parallel channel then a pipeline channel of
    one group of three processes."""
    tmp_path = tmp_path_factory.mktemp("channels")
    hostfile = write_ring_hostfile(tmp_path / "hosts.json", NUM_RANKS)
    output = tmp_path / "reports.json"
    environments = [
        {**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
        for rank in range(NUM_RANKS)
    ]
    run_ranks([sys.executable, str(RANK_SCRIPT), str(output)], environments, TIMEOUT_SECONDS)
    return json.loads(output.read_text())


def test_tensor_parallel_reports_come_back_with_the_next_message(received):
    assert received["tp"] == [
        {},
        {"1": _report(1, 1), "2": _report(2, 1)},
        {"1": _report(1, 2), "2": _report(2, 2)},
        {"1": _report(1, 3), "2": _report(2, 3)},  # with the shutdown
    ]


def test_pipeline_reports_come_back_after_each_step(received):
    # The last rank reports the step it ran; the middle rank's latest report passed down
    # with the step's message, so it is a step behind.
    assert received["pp"] == [
        {"2": _report(2, 1)},
        {"1": _report(1, 1), "2": _report(2, 2)},
        {"1": _report(1, 2), "2": _report(2, 3)},
        {},
    ]
