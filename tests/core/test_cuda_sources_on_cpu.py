"""The CUDA decode kernels' sources compiled as C++ and run on CPU threads
(cuda_emulation.py), against the references their GPU tests use, and passes of several
queries per row (speculative verifications) through the layer cache's kernel path against
gathering, then attending.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from cuda_emulation import COMPILER, CudaEmulator
from kernel_caches import kernels_built_by
from test_paged_decode_kernel import make_problem, paged_decode_attention_cuda, run
from turbo_factories import verification

from mlxcel_core.cache.paged import BatchRow, PagedBatch
from mlxcel_core.cache.paged import layer_cache as layer_cache_module
from mlxcel_core.kernels import CUDA
from mlxcel_core.kernels.paged_attention import paged_decode_attention_reference

pytestmark = pytest.mark.skipif(COMPILER is None, reason="needs g++ to run CUDA on the CPU")


@pytest.fixture
def emulated(monkeypatch, tmp_path):
    """The CUDA kernels compiled for and run on CPU threads, and the layer cache
    dispatching to them, while a test runs."""
    monkeypatch.setattr(layer_cache_module, "decode_kernel_backend", lambda *_: CUDA)
    monkeypatch.setattr(layer_cache_module, "turbo_decode_kernel_backend", lambda *_: CUDA)
    with kernels_built_by(monkeypatch, CUDA, CudaEmulator(tmp_path).cuda_kernel):
        yield


def relative_error(out: mx.array, expected: mx.array) -> float:
    difference = (out.astype(mx.float32) - expected.astype(mx.float32)).abs().max()
    return (difference / expected.astype(mx.float32).abs().max()).item()


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
@pytest.mark.parametrize("num_partitions", [1, 3])
def test_float_decode_source_on_cpu_threads_matches_the_reference(emulated, dtype, num_partitions):
    problem = make_problem(
        [70, 1, 33, 17], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=4, dtype=dtype
    )
    with mx.stream(mx.cpu):
        out = run(paged_decode_attention_cuda, problem, 0.25, num_partitions=num_partitions)
        expected = run(paged_decode_attention_reference, problem, 0.25)
    assert relative_error(out, expected) < (1e-5 if dtype == mx.float32 else 1e-2)


@pytest.mark.parametrize("cache_type", ["auto", "turbo4"])
def test_verification_through_the_decode_kernels_matches_gathering_then_attending(
    emulated, cache_type
):
    cpu = mx.Device(mx.cpu)
    out = verification(cache_type, decode_kernel=True, seed=5, device=cpu)
    expected = verification(cache_type, decode_kernel=False, seed=5, device=cpu)
    assert out.shape == expected.shape == (3, 8, 2, 32)
    assert relative_error(out, expected) < 1e-5


def test_query_tables_give_each_query_the_positions_up_to_its_own():
    batch = PagedBatch([BatchRow([3, 4], 5, 3), BatchRow([7], 2, 1)], 4)
    tables, lengths = batch.query_tables()
    assert tables.tolist() == [[3, 4], [3, 4], [3, 4], [7, 0], [7, 0], [7, 0]]
    # Row 1's second and third queries are padding: they see its whole context.
    assert lengths.tolist() == [6, 7, 8, 3, 3, 3]
