"""Ranks 1..N-1 started on this machine: each backend's variables, GPUs, exits, stopping."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from mlxcel_distributed import LocalRanks, local_backend, local_ranks, visible_cuda_devices

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


DUMP_GROUP_VARIABLES = (
    "import json, os, pathlib, sys; "
    "names = ('MLX_RANK', 'MLX_WORLD_SIZE', 'MLX_HOSTFILE', 'NCCL_HOST_IP', 'NCCL_PORT', "
    "'NCCL_SOCKET_IFNAME', 'CUDA_VISIBLE_DEVICES'); "
    "pathlib.Path(sys.argv[1], os.environ['MLX_RANK'] + '.json').write_text("
    "json.dumps({name: os.environ.get(name) for name in names}))"
)


GROUP_VARIABLES = (
    "MLX_RANK",
    "MLX_WORLD_SIZE",
    "MLX_HOSTFILE",
    "NCCL_HOST_IP",
    "NCCL_PORT",
    "NCCL_SOCKET_IFNAME",
    "CUDA_VISIBLE_DEVICES",
)


def started_variables(
    tmp_path: Path, size: int, inherited: dict[str, str] | None = None, **options
) -> tuple[dict, dict[int, dict]]:
    """Rank 0's group variables, and each child's, as `LocalRanks(**options)` sets them
    for children started with `inherited` beside this process's other variables."""
    environ = {k: v for k, v in os.environ.items() if k not in GROUP_VARIABLES}
    ended = threading.Semaphore(0)
    ranks = LocalRanks(
        [sys.executable, "-c", DUMP_GROUP_VARIABLES, str(tmp_path)],
        size,
        environ={**environ, **(inherited or {})},
        on_exit=lambda rank, code: ended.release(),
        **options,
    )
    for _ in range(size - 1):
        assert ended.acquire(timeout=30)
    assert set(ranks.stop(timeout=5).values()) == {0}
    children = {
        rank: json.loads((tmp_path / f"{rank}.json").read_text(encoding="utf-8"))
        for rank in range(1, size)
    }
    return ranks.environment, children


def test_an_nccl_group_gives_each_child_its_rank_the_rendezvous_and_a_gpu(tmp_path):
    own, children = started_variables(
        tmp_path, 3, backend="nccl", devices=["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    )
    assert own["MLX_RANK"] == "0" and own["MLX_WORLD_SIZE"] == "3"
    assert own["NCCL_HOST_IP"] == "127.0.0.1" and int(own["NCCL_PORT"]) > 0
    assert "CUDA_VISIBLE_DEVICES" not in own  # rank 0 keeps its own first GPU
    for rank, variables in children.items():
        assert variables == {
            "MLX_RANK": str(rank),
            "MLX_WORLD_SIZE": "3",
            "MLX_HOSTFILE": None,
            "NCCL_HOST_IP": "127.0.0.1",
            "NCCL_PORT": own["NCCL_PORT"],
            "NCCL_SOCKET_IFNAME": "lo",
            "CUDA_VISIBLE_DEVICES": ["GPU-a", "GPU-b", "GPU-c"][rank],
        }


def test_an_nccl_group_keeps_the_users_network_interface(tmp_path):
    own, children = started_variables(
        tmp_path, 2, {"NCCL_SOCKET_IFNAME": "eth9"}, backend="nccl", devices=["0", "1"]
    )
    assert own["NCCL_SOCKET_IFNAME"] == children[1]["NCCL_SOCKET_IFNAME"] == "eth9"


def test_the_nccl_port_is_free_on_every_interface_where_rank_0_binds_it(monkeypatch):
    asked: list[str] = []

    def free_ports(count: int, *, address: str = "127.0.0.1") -> list[int]:
        asked.append(address)
        return [29500] * count

    monkeypatch.setattr(local_ranks, "free_ports", free_ports)
    assert local_ranks.nccl_environments(2, {})[1]["NCCL_PORT"] == "29500"
    assert asked == ["0.0.0.0"]


def test_a_ring_group_shares_fewer_gpus_than_ranks_in_turn(tmp_path):
    own, children = started_variables(tmp_path, 3, backend="ring", devices=["4", "7"])
    assert {rank: variables["CUDA_VISIBLE_DEVICES"] for rank, variables in children.items()} == {
        1: "7",
        2: "4",
    }
    assert all(variables["MLX_HOSTFILE"] == own["MLX_HOSTFILE"] for variables in children.values())
    assert all(variables["NCCL_PORT"] is None for variables in children.values())


def test_without_devices_the_children_keep_the_gpus_they_inherit(tmp_path):
    _, children = started_variables(tmp_path, 2, {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert children[1]["CUDA_VISIBLE_DEVICES"] == "2,3"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backend": "nccl", "devices": ["0"]}, "nccl needs a GPU per rank: 2 ranks, 1 GPUs"),
        ({"backend": "mpi"}, "backend must be one of ring, nccl, got 'mpi'"),
    ],
)
def test_a_group_this_machine_cannot_form_is_refused_before_any_child_starts(options, message):
    with pytest.raises(ValueError, match=message):
        LocalRanks([sys.executable, "-c", "pass"], 2, environ={}, on_exit=print, **options)


@pytest.mark.parametrize(
    ("size", "devices", "backend"),
    [
        (2, ["0", "1"], "nccl"),
        (2, ["0", "1", "2"], "nccl"),
        (3, ["0", "1"], "ring"),
        (2, [], "ring"),
    ],
)
def test_nccl_only_when_every_rank_has_a_gpu(size, devices, backend):
    assert local_backend(size, devices) == backend


def test_visible_gpus_follow_cuda_visible_devices_up_to_mlx_count(monkeypatch):
    monkeypatch.setattr(local_ranks.mx.cuda, "is_available", lambda: True)
    monkeypatch.setattr(local_ranks.mx, "device_count", lambda kind: 2)
    assert visible_cuda_devices({}) == ["0", "1"]
    assert visible_cuda_devices({"CUDA_VISIBLE_DEVICES": "3, 5,6"}) == ["3", "5"]
    assert visible_cuda_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    monkeypatch.setattr(local_ranks.mx.cuda, "is_available", lambda: False)
    assert visible_cuda_devices({"CUDA_VISIBLE_DEVICES": "0,1"}) == []
