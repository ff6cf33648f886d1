"""Ranks 1..N-1 started on this machine: the ring host file, exits reported, stopping."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from mlxcel_distributed import LocalRanks

EXIT_WITH_RANK = "import os, sys; sys.exit(3 + int(os.environ['MLX_RANK']))"


def test_children_get_their_rank_and_a_ring_host_file_and_exits_are_reported():
    exits: dict[int, int] = {}
    both = threading.Event()

    def on_exit(rank: int, code: int) -> None:
        exits[rank] = code
        if len(exits) == 2:
            both.set()

    ranks = LocalRanks(
        [sys.executable, "-c", EXIT_WITH_RANK], 3, environ=dict(os.environ), on_exit=on_exit
    )
    assert both.wait(30)
    assert exits == {1: 4, 2: 5}
    assert ranks.environment["MLX_RANK"] == "0"
    hosts = json.loads(Path(ranks.environment["MLX_HOSTFILE"]).read_text(encoding="utf-8"))
    assert len(hosts) == 3 and len({host[0] for host in hosts}) == 3
    assert all(len(host) == 1 and host[0].startswith("127.0.0.1:") for host in hosts)
    assert ranks.stop(timeout=5) == {1: 4, 2: 5}


def test_stop_kills_children_still_running_without_reporting_them():
    reported = []
    ranks = LocalRanks(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        2,
        environ=dict(os.environ),
        on_exit=lambda rank, code: reported.append(rank),
    )
    assert ranks.stop(timeout=0) == {1: -9}
    assert reported == []


SIGNAL_THEN_SLEEP = (
    "import os, time; from mlxcel_distributed import READY_FD_VARIABLE, signal_ready; "
    "signal_ready(int(os.environ[READY_FD_VARIABLE])); time.sleep(600)"
)


def test_rank_0_waits_until_every_child_is_joining():
    ranks = LocalRanks(
        [sys.executable, "-c", SIGNAL_THEN_SLEEP],
        3,
        environ=dict(os.environ),
        on_exit=lambda rank, code: None,
    )
    try:
        assert ranks.wait_until_ready()
    finally:
        assert ranks.stop(timeout=0) == {1: -9, 2: -9}


def test_children_that_exit_before_joining_are_reported_before_the_wait_ends():
    exits: dict[int, int] = {}
    ranks = LocalRanks(
        [sys.executable, "-c", EXIT_WITH_RANK],
        3,
        environ=dict(os.environ),
        on_exit=exits.__setitem__,
    )
    assert not ranks.wait_until_ready()
    assert exits == {1: 4, 2: 5}
    ranks.stop(timeout=5)
