"""Which backend a command's group uses: the launcher's, or one fitted to this machine."""

from __future__ import annotations

import types

import pytest

from mlxcel.distributed import rank_group

NCCL_RENDEZVOUS = {"MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "10.0.0.1", "NCCL_PORT": "29500"}


@pytest.mark.parametrize(
    ("environ", "backend"),
    [
        ({"MLX_RANK": "1", "MLX_HOSTFILE": "hosts.json"}, "ring"),
        ({"MLX_RANK": "1", **NCCL_RENDEZVOUS}, "nccl"),
        ({"MLX_RANK": "1", "MLX_HOSTFILE": "hosts.json", **NCCL_RENDEZVOUS}, "ring"),
        # A stray NCCL_HOST_IP in a cluster's shell is not mlx.launch's NCCL group.
        ({"MLX_RANK": "1", "NCCL_HOST_IP": "10.0.0.1"}, "any"),
        ({"MLX_RANK": "1"}, "any"),
    ],
)
def test_a_launched_rank_joins_with_the_backend_its_variables_describe(environ, backend):
    assert rank_group.launched_backend(environ) == backend


class RecordingRanks:
    """Stands in for `LocalRanks`: records how it was started, starts nothing."""

    started: dict[str, object] = {}  # noqa: RUF012 - one record per test

    def __init__(self, command, size, *, environ, on_exit, backend, devices):
        RecordingRanks.started = {"size": size, "backend": backend, "devices": devices}
        if backend == "ring":
            self.environment = {"MLX_RANK": "0", "MLX_HOSTFILE": "/tmp/hostfile.json"}
        else:
            self.environment = {"MLX_RANK": "0", **NCCL_RENDEZVOUS}

    def wait_until_ready(self) -> bool:
        return True


@pytest.mark.parametrize(("gpus", "backend"), [(["0", "1"], "nccl"), (["0"], "ring")])
def test_local_ranks_get_the_gpus_and_rank_0_joins_their_backend(monkeypatch, gpus, backend):
    from mlxcel_distributed import local_backend

    joined: list[str] = []
    distributed = types.SimpleNamespace(
        LocalRanks=RecordingRanks,
        READY_FD_VARIABLE="MLXCEL_READY_FD",
        GroupError=RuntimeError,
        join_group=lambda size, backend: joined.append(backend) or "group",
        visible_cuda_devices=lambda environ: gpus,
        local_backend=local_backend,
    )
    monkeypatch.setattr(rank_group.os, "environ", {})
    group, _ = rank_group.form_group(
        distributed, ("serve",), 2, "--tp", {"OPENBLAS_NUM_THREADS": "1"}, lambda *_: None
    )
    assert group == "group"
    assert RecordingRanks.started == {"size": 2, "backend": backend, "devices": gpus}
    assert joined == [backend]
