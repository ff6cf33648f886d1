"""Prefill attention at a rounded query count equals attention at the real one."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.cache.paged.prefill_lengths import (
    causal_attention_at_rounded_length,
    rounds_prefill_lengths,
)


def qkv(num_queries: int, offset: int, seed: int = 0) -> tuple[mx.array, mx.array, mx.array]:
    """Queries of 6 heads over keys and values of 2 heads (grouped-query), head size 16."""
    key = mx.random.key(seed)
    q_key, k_key, v_key = mx.random.split(key, 3)
    num_keys = offset + num_queries
    return (
        mx.random.normal((1, 6, num_queries, 16), key=q_key),
        mx.random.normal((1, 2, num_keys, 16), key=k_key),
        mx.random.normal((1, 2, num_keys, 16), key=v_key),
    )


@pytest.mark.parametrize("offset", [0, 16, 37])
@pytest.mark.parametrize("num_queries", [2, 63, 64, 65, 130])
def test_rounded_attention_equals_causal_attention_at_the_real_length(num_queries, offset):
    queries, keys, values = qkv(num_queries, offset)
    expected = mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=0.25, mask="causal"
    )
    got = causal_attention_at_rounded_length(queries, keys, values, scale=0.25)
    assert got.shape == expected.shape == (1, 6, num_queries, 16)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5, atol=1e-6)


def test_padding_queries_alone_would_shift_the_mask():
    # The padded keys are what keeps the bottom-right mask aligned with the real queries.
    queries, keys, values = qkv(5, 3)
    at_end = [(0, 0), (0, 0), (0, 59), (0, 0)]
    shifted = mx.fast.scaled_dot_product_attention(
        mx.pad(queries, at_end), keys, values, scale=0.25, mask="causal"
    )
    expected = causal_attention_at_rounded_length(queries, keys, values, scale=0.25)
    assert not np.allclose(np.array(shifted[:, :, :5]), np.array(expected), atol=1e-3)


def test_rounding_rejects_a_bad_multiple_and_fewer_keys_than_queries():
    queries, keys, values = qkv(4, 0)
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        causal_attention_at_rounded_length(queries, keys, values, scale=1.0, multiple=0)
    with pytest.raises(ValueError, match="3 keys cannot hold the 4 queries"):
        causal_attention_at_rounded_length(queries, keys[:, :, :3], values[:, :, :3], scale=1.0)


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason="checks the CPU's choice")
def test_the_cpu_attends_at_the_real_length():
    queries, _, values = qkv(70, 0)
    assert not rounds_prefill_lengths(queries.astype(mx.bfloat16), values.astype(mx.bfloat16))


def test_only_what_cuda_sends_to_cudnn_is_rounded(monkeypatch):
    from mlxcel_core.cache.paged import prefill_lengths

    monkeypatch.setattr(prefill_lengths.mx, "default_device", lambda: mx.Device(mx.gpu))
    monkeypatch.setattr(prefill_lengths.mx.cuda, "is_available", lambda: True)
    monkeypatch.delenv(prefill_lengths.CUDNN_ATTENTION_VARIABLE, raising=False)

    def rounds(dtype: mx.Dtype, head_dim: int) -> bool:
        queries = mx.zeros((1, 4, 70, head_dim), dtype=dtype)
        values = mx.zeros((1, 2, 70, head_dim), dtype=dtype)
        return rounds_prefill_lengths(queries, values)

    assert rounds(mx.bfloat16, 64) and rounds(mx.float16, 128)
    assert not rounds(mx.float32, 64)
    assert not rounds(mx.bfloat16, 256)
    assert not rounds(mx.bfloat16, 60)
    monkeypatch.setenv(prefill_lengths.CUDNN_ATTENTION_VARIABLE, "0")
    assert not rounds(mx.bfloat16, 64)
