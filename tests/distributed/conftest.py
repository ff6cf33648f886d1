import pytest

import mlxcel_distributed


@pytest.fixture
def no_spawning(monkeypatch):
    """Fail the test if a command starts or joins a group of ranks."""

    def refuse(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(mlxcel_distributed, "LocalRanks", refuse)
    monkeypatch.setattr(mlxcel_distributed, "join_group", refuse)
