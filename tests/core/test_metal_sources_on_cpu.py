"""The Metal kernels' sources compiled as C++ and run on CPU threads (metal_emulation.py),
against the references their GPU tests use: what can be checked of their arithmetic,
indexing and synchronisation without an Apple GPU.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from kernel_caches import kernels_built_by
from metal_emulation import COMPILER, MetalEmulator
from test_paged_decode_kernel import make_problem, paged_decode_attention_metal, run
from test_turbo_metal_kernels import (
    encoder_problem,
    turbo_decode_attention_metal,
    turbo_encode_metal,
)
from turbo_factories import attend_from_storage, decode_batch, gather_then_attend, written_storage

from mlxcel_core.cache.paged.centering import first_block_means
from mlxcel_core.kernels import METAL
from mlxcel_core.kernels.paged_attention import paged_decode_attention_reference

pytestmark = pytest.mark.skipif(COMPILER is None, reason="needs g++ to run Metal on the CPU")


@pytest.fixture
def emulated(monkeypatch, tmp_path):
    """The Metal kernels compiled for and run on CPU threads while a test runs."""
    with kernels_built_by(monkeypatch, METAL, MetalEmulator(tmp_path).metal_kernel):
        yield


LENGTHS = [70, 1, 33, 17, 16]


def relative_error(out: mx.array, expected: mx.array) -> float:
    difference = (out.astype(mx.float32) - expected.astype(mx.float32)).abs().max()
    return (difference / expected.astype(mx.float32).abs().max()).item()


@pytest.mark.parametrize("num_partitions", [1, 3])
def test_turbo_decode_source_on_cpu_threads_matches_decoding_then_attending(
    emulated, num_partitions
):
    storage, tables = written_storage(
        LENGTHS,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        key_type="turbo3",
        value_type="turbo2",
        dtype=mx.float32,
        seed=80,
        device=mx.Device(mx.cpu),
    )
    batch = decode_batch(tables, LENGTHS, 16)
    queries = mx.array(np.random.default_rng(7).standard_normal((5, 8, 1, 64)), mx.float32)
    with mx.stream(mx.cpu):
        out = attend_from_storage(
            turbo_decode_attention_metal,
            storage,
            batch,
            queries,
            scale=0.125,
            num_partitions=num_partitions,
        )
        expected = gather_then_attend(storage, batch, queries, 0.125)
    assert relative_error(out, expected) < 1e-5


def test_float_decode_source_on_cpu_threads_matches_the_reference(emulated):
    problem = make_problem(
        [70, 1, 33, 17], num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=4, seed=3
    )
    with mx.stream(mx.cpu):
        out = run(paged_decode_attention_metal, problem, 0.25, num_partitions=3)
        expected = run(paged_decode_attention_reference, problem, 0.25)
    assert relative_error(out, expected) < 1e-5


def test_encoder_source_on_cpu_threads_stores_what_the_plain_encoder_does(emulated):
    vectors, codebook, centering, storage = encoder_problem(True)
    key_codec, _ = storage.codecs(0)
    with mx.stream(mx.cpu):
        parts = turbo_encode_metal(vectors, codebook, centering)
        means = first_block_means(storage.keys[0], key_codec, centering.anchor_slots)
        shift = mx.where(centering.write_centered[:, None, None], means[centering.write_rows], 0)
        plain = key_codec.encode(vectors - shift)
    for part, plain_part in zip(parts, plain, strict=True):
        assert part.dtype == plain_part.dtype and mx.array_equal(part, plain_part)
