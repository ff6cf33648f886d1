"""BitLinear's ternary matmul in plain MLX: the arithmetic of mlx-lm's Metal kernel
(`mlx_lm.models.bitlinear_layers.make_bitlinear_kernel`), for devices without Metal."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

# Ternary weights per packed byte: 2 bits each.
_WEIGHTS_PER_BYTE = 4


def unpack_ternary(packed_weights: mx.array, out_features: int) -> mx.array:
    """The (out_features, in_features) float32 ternary matrix a BitLinear layer packs.

    Byte (r, c) of the packed (out_features / 4, in_features) uint8 weights holds, in its
    bit pairs from the lowest, the weights of rows r, r + out/4, r + 2 out/4 and
    r + 3 out/4 at column c, each stored as the weight + 1 (0, 1 or 2).

    Raises:
        ValueError: `out_features` is not a multiple of 4, as the kernel requires.
    """
    if out_features % _WEIGHTS_PER_BYTE:
        raise ValueError(f"out_features must be a multiple of 4, got {out_features}")
    codes = packed_weights[: out_features // _WEIGHTS_PER_BYTE].astype(mx.uint8)
    return mx.concatenate(
        [
            mx.bitwise_and(mx.right_shift(codes, 2 * i), 3).astype(mx.float32) - 1
            for i in range(_WEIGHTS_PER_BYTE)
        ]
    )


def bitlinear_matmul(
    *,
    inputs: Sequence[mx.array],
    template: Sequence[tuple[str, object]],
    grid: tuple[int, int, int],
    threadgroup: tuple[int, int, int],
    output_shapes: Sequence[tuple[int, ...]],
    output_dtypes: Sequence[mx.Dtype],
) -> list[mx.array]:
    """mlx-lm's `bitlinear_matmul` Metal kernel, called as BitLinear calls it.

    Computes out = T(sum_c x[n, c] w[o, c] * s) in float32, w the unpacked ternary
    weights (`unpack_ternary`), s the weight scale or, with `invert_weight_scales`, its
    inverse; the kernel's launch geometry (`grid`, `threadgroup`) has no counterpart.

    Args:
        inputs: x (N, in_features) of dtype T, the packed (out_features / 4,
            in_features) uint8 weights, the (1,) weight scale.
        template: T, invert_weight_scales, in_features and out_features.
        grid: unused.
        threadgroup: unused.
        output_shapes: [(N, out_features)].
        output_dtypes: [T].

    Returns:
        [out]: (N, out_features) of dtype T.
    """
    x, packed_weights, weight_scale = inputs
    settings = dict(template)
    weights = unpack_ternary(packed_weights, int(settings["out_features"]))  # type: ignore[arg-type]
    scale = weight_scale[0].astype(mx.float32)
    if settings["invert_weight_scales"]:
        scale = 1 / scale
    sums = x.astype(mx.float32) @ weights.T
    return [(sums * scale).astype(output_dtypes[0]).reshape(output_shapes[0])]
