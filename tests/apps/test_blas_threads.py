"""The BLAS threads of ranks one machine runs: the cores shared among them."""

from __future__ import annotations

import ctypes
import types
from typing import ClassVar

import pytest

from mlxcel.common import blas_threads
from mlxcel.distributed import rank_group


@pytest.mark.parametrize(
    ("cores", "ranks", "threads"), [(2, 2, 1), (2, 3, 1), (16, 4, 4), (16, 3, 5), (None, 2, 1)]
)
def test_each_rank_gets_its_share_of_the_cores(monkeypatch, cores, ranks, threads):
    monkeypatch.setattr(blas_threads.os, "cpu_count", lambda: cores)
    assert blas_threads.threads_per_rank(ranks) == threads


def test_a_threads_setting_of_the_user_is_kept(monkeypatch):
    monkeypatch.setattr(blas_threads.os, "cpu_count", lambda: 8)
    assert blas_threads.rank_blas_environment({}, 2) == {"OPENBLAS_NUM_THREADS": "4"}
    assert blas_threads.rank_blas_environment({"OPENBLAS_NUM_THREADS": "3"}, 2) == {}
    assert blas_threads.rank_blas_environment({"OMP_NUM_THREADS": "3"}, 2) == {}


@pytest.mark.parametrize(("cores", "threads"), [(2, 1), (1, 1), (8, 7), (None, 1)])
def test_one_process_gets_the_cores_mlx_leaves(monkeypatch, cores, threads):
    monkeypatch.setattr(blas_threads.os, "cpu_count", lambda: cores)
    limited: list[int] = []
    monkeypatch.setattr(blas_threads, "limit_own_blas_threads", lambda n: limited.append(n) or True)
    assert blas_threads.limit_process_blas_threads({})
    assert limited == [threads]


@pytest.mark.parametrize("name", ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"])
def test_one_process_keeps_the_threads_its_environment_sets(monkeypatch, name):
    limited: list[int] = []
    monkeypatch.setattr(blas_threads, "limit_own_blas_threads", limited.append)
    assert not blas_threads.limit_process_blas_threads({name: "2"})
    assert limited == []


class FakeLocalRanks:
    started_with: ClassVar[dict[str, str]] = {}

    def __init__(self, command, size, *, environ, on_exit, backend, devices):
        FakeLocalRanks.started_with = dict(environ)
        self.environment: dict[str, str] = {}

    def wait_until_ready(self) -> bool:
        return True


def fake_distributed() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        LocalRanks=FakeLocalRanks,
        READY_FD_VARIABLE="MLXCEL_READY_FD",
        GroupError=RuntimeError,
        join_group=lambda size, backend: "group",
        visible_cuda_devices=lambda environ: [],
        local_backend=lambda size, devices: "ring",
    )


@pytest.mark.parametrize(
    ("environ", "children", "own"),
    [({}, "1", [1]), ({"OPENBLAS_NUM_THREADS": "2"}, "2", [])],
)
def test_local_ranks_and_rank_0_take_the_shared_threads(monkeypatch, environ, children, own):
    monkeypatch.setattr(blas_threads.os, "cpu_count", lambda: 2)
    limited: list[int] = []
    monkeypatch.setattr(rank_group, "limit_own_blas_threads", limited.append)
    group, _ = rank_group.form_group(
        fake_distributed(), ("generate",), 2, "--pp", environ, lambda rank, code: None
    )
    assert group == "group"
    assert FakeLocalRanks.started_with["OPENBLAS_NUM_THREADS"] == children
    assert limited == own


def test_limiting_this_process_reaches_openblas_when_it_is_loaded():
    try:
        get_threads = ctypes.CDLL(None).openblas_get_num_threads
    except AttributeError:
        assert not blas_threads.limit_own_blas_threads(1)
        return
    current = get_threads()
    try:
        assert blas_threads.limit_own_blas_threads(1)
        assert get_threads() == 1
    finally:
        blas_threads.limit_own_blas_threads(current)


def test_a_started_process_gets_the_commands_threads_unless_the_environment_sets_them():
    threads = str(blas_threads.process_threads())
    started = blas_threads.with_process_threads({"A": "1"})
    assert started == {"A": "1", blas_threads.THREADS_VARIABLE: threads}
    assert blas_threads.with_process_threads({"OMP_NUM_THREADS": "3"}) == {"OMP_NUM_THREADS": "3"}
