"""What the paged attention tests share: the block size, the float32 tolerance, and the
count of the decode passes that attend by length groups (a path the CPU takes)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxcel_core.cache.paged import PagedLayerCache

BLOCK_SIZE = 4
FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}

ON_THE_CPU = pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="length groups serve the CPU's decode passes"
)


def count_group_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call of attention by length groups, as the number of groups it attended by."""
    calls: list[int] = []
    attend = PagedLayerCache._attend_by_length

    def counted(self, queries, scale, groups, order):
        calls.append(len(groups))
        return attend(self, queries, scale, groups, order)

    monkeypatch.setattr(PagedLayerCache, "_attend_by_length", counted)
    return calls
