"""The paged decode launch takes the split count stored for its shape from the installed
tunings; the kernels are faked, so this runs without a GPU."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxcel_core.autotune.paged_decode import partition_candidates
from mlxcel_core.kernels import CUDA
from mlxcel_core.kernels.paged_attention import decode
from mlxcel_core.kernels.paged_attention.grid import num_partitions_for
from mlxcel_core.tuning import (
    PAGED_DECODE_PARTITIONS,
    TunedEntry,
    Tunings,
    TuningScope,
    TuningStore,
    install_tunings,
    paged_decode_bucket,
)

ROWS, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCKS_PER_ROW = 2, 8, 2, 64, 16, 256


class FakeKernels:
    """Stands in for the compiled kernels: records each launch's grid, returns zeros."""

    def __init__(self) -> None:
        self.grids: list[tuple[int, int, int]] = []

    def __call__(self, backend) -> dict[str, object]:
        return {name: self._launch for name in ("one_pass", "split", "merge")}

    def _launch(self, *, grid, output_shapes, output_dtypes, **_):
        self.grids.append(grid)
        pairs = zip(output_shapes, output_dtypes, strict=True)
        return [mx.zeros(shape, dtype) for shape, dtype in pairs]


@pytest.fixture
def uninstall_tunings():
    yield
    install_tunings(Tunings(None))


def launched_partitions(monkeypatch) -> int:
    kernels = FakeKernels()
    monkeypatch.setattr(decode, "kernels", kernels)
    decode.paged_decode_attention_kernel(
        mx.zeros((ROWS, Q_HEADS, 1, HEAD_DIM), mx.float16),
        mx.zeros((8, KV_HEADS, HEAD_DIM), mx.float16),
        mx.zeros((8, KV_HEADS, HEAD_DIM), mx.float16),
        mx.zeros((ROWS, BLOCKS_PER_ROW), mx.int32),
        mx.ones((ROWS,), mx.int32),
        block_size=BLOCK_SIZE,
        scale=0.125,
        backend=CUDA,
    )
    return kernels.grids[0][2]


@pytest.mark.parametrize("enabled", [False, True])
def test_the_launch_takes_the_stored_split_only_with_autotune_set(
    tmp_path, monkeypatch, uninstall_tunings, enabled
):
    capacity = BLOCKS_PER_ROW * BLOCK_SIZE
    bucket = paged_decode_bucket(
        dtype=mx.float16, group_size=Q_HEADS // KV_HEADS, head_dim=HEAD_DIM,
        num_kv_heads=KV_HEADS, num_rows=ROWS, capacity_tokens=capacity,
    )  # fmt: skip
    default = num_partitions_for(ROWS, KV_HEADS, capacity)
    stored = 2 if default != 2 else 4
    TuningStore(tmp_path / "autotune", TuningScope.current()).record(
        TunedEntry(PAGED_DECODE_PARTITIONS, bucket, stored, default, 1.0, 2.0)
    )
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path), "MLXCEL_AUTOTUNE": "1" if enabled else "0"}
    install_tunings(Tunings.from_environ(environ))
    assert launched_partitions(monkeypatch) == (stored if enabled else default)


def test_split_candidates_are_capped_as_the_default_is_and_include_it():
    assert partition_candidates(32768, 64) == (1, 2, 4, 8, 16, 32, 64)
    assert partition_candidates(4096, 8) == (1, 2, 4, 8)
    assert partition_candidates(256, 1) == (1,)
    assert partition_candidates(32768, 43) == (1, 2, 4, 8, 16, 32, 43, 64)
