"""Building blocks shared by the VITS parts, channels-last `(B, T, C)` as MLX convolves."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxcel_audio.piper.weights import ConvSpec


class LayerNorm(nn.Module):
    """Layer norm over channels with VITS's parameter names (`gamma`, `beta`)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = mx.ones((channels,))
        self.beta = mx.zeros((channels,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.layer_norm(x, self.gamma, self.beta, self.eps)


def make_conv(
    shape: tuple[int, ...], spec: ConvSpec, *, groups: int = 1, bias: bool = True
) -> nn.Conv1d:
    """A Conv1d for a PyTorch weight of `shape` `(out, in / groups, k)` run as `spec` says."""
    out_channels, in_per_group, kernel_size = shape
    return nn.Conv1d(
        in_per_group * groups,
        out_channels,
        kernel_size,
        stride=spec.stride,
        padding=spec.padding,
        dilation=spec.dilation,
        groups=groups,
        bias=bias,
    )


def split_channels(x: mx.array) -> tuple[mx.array, mx.array]:
    """The two halves of the channel axis, as the coupling flows split them."""
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]
