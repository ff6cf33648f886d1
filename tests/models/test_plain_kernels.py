"""The plain-MLX paths of mlx-lm's Metal-only kernels compute what the kernels' sources
say: each is checked against a NumPy transcription of its kernel, element by element,
float32 arithmetic rounded to T where the kernel casts."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import bitlinear_layers

from mlxcel_models.plain_kernels import experts, norms, route_plain_kernels
from mlxcel_models.plain_kernels.bitlinear import bitlinear_matmul

F32 = np.float32
RNG = np.random.default_rng(0)


def as_np(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def ternary_reference(x, packed, scale, out_features, invert):
    """bitlinear_matmul's source: output row row_idx + i * out/4 reads bit pair i of
    byte (row_idx, c) as ((w >> 2i) & 3) - 1; the sum times scale (or 1 / scale)."""
    rows = out_features // 4
    out = np.zeros((x.shape[0], out_features), F32)
    for r in range(rows):
        for i in range(4):
            weights = ((packed[r].astype(np.int32) >> (2 * i)) & 3) - 1
            out[:, r + i * rows] = x @ weights.astype(F32)
    return out * F32(1 / scale if invert else scale)


@pytest.mark.parametrize("invert", [False, True])
def test_the_ternary_matmul_unpacks_bit_pairs_as_the_kernel_does(invert):
    x = RNG.integers(-4, 5, (3, 16)).astype(F32)
    packed = RNG.integers(0, 256, (5, 16)).astype(np.uint8)
    out = bitlinear_matmul(
        inputs=[mx.array(x), mx.array(packed), mx.array([0.5])],
        template=[("T", mx.float32), ("invert_weight_scales", invert),
                  ("in_features", 16), ("out_features", 20)],
        grid=(32, 15, 1), threadgroup=(32, 1, 1),
        output_shapes=[(3, 20)], output_dtypes=[mx.float32],
    )[0]  # fmt: skip
    np.testing.assert_array_equal(as_np(out), ternary_reference(x, packed, 0.5, 20, invert))
    with pytest.raises(ValueError, match="multiple of 4, got 18"):
        bitlinear_matmul(
            inputs=[mx.array(x), mx.array(packed), mx.array([1.0])],
            template=[("invert_weight_scales", False), ("out_features", 18)],
            grid=(1, 1, 1), threadgroup=(1, 1, 1),
            output_shapes=[(3, 18)], output_dtypes=[mx.float32],
        )  # fmt: skip


def normed_heads_reference(qkvg, hq, hk, d, eps, scale, dtype):
    """qk_norm's source, row by row: rstd from the float32 sum of squares, y rounded to
    T, q's y scaled and rounded again."""
    heads = qkvg[..., : (hq + hk) * d].reshape(*qkvg.shape[:-1], hq + hk, d).astype(F32)
    rstd = F32(1) / np.sqrt((heads * heads).sum(-1, keepdims=True) / F32(d) + F32(eps))
    y = (heads * rstd).astype(dtype).astype(F32)
    q = (y[..., :hq, :] * F32(scale)).astype(dtype).astype(F32)
    return q, y[..., hq:, :]


def rope_reference(y, positions, rope_base):
    """qk_norm_rope's rotation: element d pairs with d ^ 1, inv_freq =
    exp2(-(d / 2) / (D / 2) * log2(base))."""
    D = y.shape[-1]
    d = np.arange(D)
    inv_freq = np.exp2(-(F32(1) * (d // 2) / (D // 2)) * F32(math.log2(rope_base))).astype(F32)
    theta = positions.astype(F32)[..., None, None] * inv_freq
    c, s = np.cos(theta), np.sin(theta)
    other = y[..., d ^ 1]
    return np.where(d % 2 == 0, y * c - other * s, other * s + y * c)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_qk_norm_and_rope_follow_the_kernels(dtype):
    hq, hk, d = 4, 2, 16
    qkvg = RNG.normal(size=(2, 3, 2 * (hq + hk) * d)).astype(F32)
    x = mx.array(qkvg).astype(dtype)
    np_dtype = np.float16 if dtype == mx.float16 else F32
    tol = {"rtol": 2e-3, "atol": 2e-3} if dtype == mx.float16 else {"rtol": 1e-5, "atol": 1e-5}
    settings = {"n_heads": hq, "n_kv_heads": hk, "head_dim": d, "eps": 1e-6, "query_scale": 0.7}
    q_ref, k_ref = normed_heads_reference(as_np(x), hq, hk, d, 1e-6, 0.7, np_dtype)
    q, k = norms.qk_norm(x, **settings)
    assert q.shape == (2, 3, hq, d) and k.dtype == dtype
    np.testing.assert_allclose(as_np(q), q_ref, **tol)
    np.testing.assert_allclose(as_np(k), k_ref, **tol)

    offsets = np.array([5, 40])
    for offset in (mx.array(offsets), 7):
        positions = np.arange(3) + (offsets[:, None] if isinstance(offset, mx.array) else offset)
        q, k = norms.qk_norm_rope(x, **settings, rope_base=10000.0, offset=offset)
        np.testing.assert_allclose(as_np(q), rope_reference(q_ref, positions, 10000.0), **tol)
        np.testing.assert_allclose(as_np(k), rope_reference(k_ref, positions, 10000.0), **tol)


def test_the_gated_output_norm_follows_the_kernel():
    B, H, L, D = 2, 3, 4, 8
    x = RNG.normal(size=(B, H, L, D)).astype(F32)
    gate = RNG.normal(size=(B, L, H * D)).astype(F32)
    out = norms.rms_norm_sigmoid_gate(mx.array(x), mx.array(gate), eps=1e-5)
    heads = x.transpose(0, 2, 1, 3)
    rstd = 1 / np.sqrt((heads * heads).sum(-1, keepdims=True) / D + F32(1e-5))
    sig = 1 / (1 + np.exp(-gate.reshape(B, L, H, D)))
    np.testing.assert_allclose(as_np(out), (heads * rstd * sig).reshape(B, L, H * D), rtol=1e-5)


def test_norm_add_norm_and_pre_norm_follow_the_kernels():
    D = 32
    branch = mx.array(RNG.normal(size=(2, 3, D))).astype(mx.float16)
    stream = RNG.normal(size=(2, 3, D)).astype(F32)
    alpha, beta, post = (RNG.normal(size=D).astype(F32) for _ in range(3))
    next_norm = nn.RMSNorm(D, eps=1e-6)
    next_norm.weight = mx.array(RNG.normal(size=D).astype(F32))
    new_stream, normed = norms.norm_add_norm(
        branch, mx.array(stream), alpha=mx.array(alpha), beta=mx.array(beta),
        post_weight=mx.array(post), post_eps=1e-5, next_norm=next_norm,
    )  # fmt: skip

    h = np.float16
    v = (post.astype(h).astype(F32) * as_np(branch)).astype(h).astype(F32)
    rstd = 1 / np.sqrt((v * v).sum(-1, keepdims=True) / D + F32(1e-5))
    s = alpha * stream + beta * (v * rstd).astype(h).astype(F32)
    rstd = 1 / np.sqrt((s * s).sum(-1, keepdims=True) / D + F32(1e-6))
    np.testing.assert_allclose(as_np(new_stream), s, rtol=1e-5, atol=1e-5)
    assert normed is not None and normed.dtype == mx.float16
    reference = (s * rstd * as_np(next_norm.weight)).astype(h).astype(F32)
    np.testing.assert_allclose(as_np(normed), reference, rtol=2e-3, atol=2e-3)
    pre = norms.pre_norm(new_stream, next_norm, dtype=mx.float16)
    np.testing.assert_allclose(as_np(pre), reference, rtol=2e-3, atol=2e-3)
    plain_stream, none = norms.norm_add_norm(
        branch, mx.array(stream), alpha=mx.array(alpha), beta=mx.array(beta),
        post_weight=None, post_eps=1e-5, next_norm=None,
    )  # fmt: skip
    v = as_np(branch)
    rstd = 1 / np.sqrt((v * v).sum(-1, keepdims=True) / D + F32(1e-5))
    expected = alpha * stream + beta * (v * rstd).astype(h).astype(F32)
    assert none is None
    np.testing.assert_allclose(as_np(plain_stream), expected, rtol=1e-5, atol=1e-5)


def routing_reference(logits, bias, top_k, multiplier, eps, scale):
    """expert_routing's source, token by token: the stable sigmoid, the k-th winner the
    highest biased score (lowest index on a tie), weights over their running sum."""
    inds = np.zeros((*logits.shape[:-1], top_k), np.uint32)
    weights = np.zeros((*logits.shape[:-1], top_k), F32)
    for token in np.ndindex(logits.shape[:-1]):
        x = logits[token] * F32(multiplier)
        y = 1 / (1 + np.exp(np.abs(x)))
        score = np.where(x < 0, y, 1 - y).astype(F32)
        biased = score + bias
        w = []
        for k in range(top_k):
            winner = int(np.flatnonzero(biased == biased.max())[0])
            inds[token][k] = winner
            w.append(score[winner])
            biased[winner] = -np.inf
        total = F32(0)
        for value in w:
            total = value + total
        weights[token] = np.array(w, F32) / (total + F32(eps)) * F32(scale)
    return inds, weights


def test_expert_routing_follows_the_kernel_ties_included():
    logits = RNG.normal(size=(2, 3, 8)).astype(F32)
    logits[0, 0, [2, 5]] = 3.0  # a tie for the first place: the lower index wins
    bias = RNG.normal(size=8).astype(F32) * 0.1
    bias[5] = bias[2]
    inds, weights = experts.expert_routing(
        mx.array(logits), mx.array(bias), top_k=3, multiplier=1.5, score_eps=1e-20,
        route_scale=2.5,
    )  # fmt: skip
    ref_inds, ref_weights = routing_reference(logits, bias, 3, 1.5, 1e-20, 2.5)
    assert inds.dtype == mx.uint32
    np.testing.assert_array_equal(np.array(inds), ref_inds)
    np.testing.assert_allclose(np.array(weights), ref_weights, rtol=1e-6)


def test_the_expert_combine_rounds_after_each_addition_as_the_kernel():
    h = np.float16
    outputs = mx.array(RNG.normal(size=(2, 3, 4, 16))).astype(mx.float16)
    weights = RNG.uniform(size=(2, 3, 4)).astype(F32)
    norm_weight = RNG.normal(size=16).astype(F32)
    out = experts.post_expert_norm_combine(
        outputs, mx.array(weights), norm_weight=mx.array(norm_weight), eps=1e-6
    )
    v = as_np(outputs) * norm_weight
    inv = 1 / np.sqrt((v * v).sum(-1, keepdims=True) / 16 + F32(1e-6))
    ew = weights.astype(h).astype(F32)
    acc = np.zeros((2, 3, 16), F32)
    for k in range(4):
        acc = (acc + v[..., k, :] * inv[..., k, :] * ew[..., k, None]).astype(h).astype(F32)
    assert out.dtype == mx.float16
    np.testing.assert_allclose(as_np(out), acc, rtol=2e-3, atol=2e-3)


@pytest.mark.skipif(mx.metal.is_available(), reason="with Metal, mlx-lm's kernels run")
def test_without_metal_a_model_calls_the_plain_paths():
    layer = bitlinear_layers.BitLinear(8, 4, bias=False)
    route_plain_kernels(layer)
    assert bitlinear_layers._bitlinear_kernel is bitlinear_matmul
    layer.weight = mx.array([[0b10_01_00_10] * 8], dtype=mx.uint8)
    out = layer(mx.ones((1, 8)))
    np.testing.assert_array_equal(np.array(out), [[8.0, -8.0, 0.0, 8.0]])
