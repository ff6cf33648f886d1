"""VITS duration predictors: encoder hidden states -> log-durations.

The stochastic one (Kim et al. 2021, VITS, section 2.2.2) runs its flows in reverse from
noise; the deterministic one (Glow-TTS's, Kim et al. 2020, which VITS trains without
`use_sdp`) is a small convolutional regressor. Ported from Piper's `vits/models.py`
(`StochasticDurationPredictor`, `DurationPredictor`) and `vits/modules.py` (`DDSConv`,
`ConvFlow`, `ElementwiseAffine`, `Flip`). Of the stochastic predictor only the flows used in
reverse are kept: the posterior flows serve training, and the first coupling flow is dropped
by the reference at inference. Both add a multi-speaker voice's speaker embedding, through
a 1x1 convolution `cond`, to their input.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from mlxcel_audio.piper.layers import Conv1d, LayerNorm, split_channels
from mlxcel_audio.piper.spline import inverse_rational_quadratic

NUM_BINS = 10
TAIL_BOUND = 5.0


class DilatedDepthSeparableConv(nn.Module):
    """Residual stack of dilated depthwise conv -> norm -> GELU -> 1x1 conv -> norm -> GELU."""

    def __init__(self, channels: int, kernel_size: int, num_layers: int):
        super().__init__()
        self.convs_sep = [
            Conv1d(
                channels,
                channels,
                kernel_size,
                padding=(kernel_size**i * (kernel_size - 1)) // 2,
                dilation=kernel_size**i,
                groups=channels,
            )
            for i in range(num_layers)
        ]
        self.convs_1x1 = [Conv1d(channels, channels, 1) for _ in range(num_layers)]
        self.norms_1 = [LayerNorm(channels) for _ in range(num_layers)]
        self.norms_2 = [LayerNorm(channels) for _ in range(num_layers)]

    def __call__(self, x: mx.array) -> mx.array:
        for sep, pointwise, norm_1, norm_2 in zip(
            self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2, strict=True
        ):
            y = nn.gelu(norm_1(sep(x)))
            x = x + nn.gelu(norm_2(pointwise(y)))
        return x


class ConvFlow(nn.Module):
    """Coupling flow whose second half goes through a rational-quadratic spline."""

    def __init__(self, channels: int, kernel_size: int, num_layers: int):
        super().__init__()
        self.filter_channels = channels
        self.pre = Conv1d(1, channels, 1)
        self.convs = DilatedDepthSeparableConv(channels, kernel_size, num_layers)
        self.proj = Conv1d(channels, 3 * NUM_BINS - 1, 1)

    def reverse(self, z: mx.array, condition: mx.array) -> mx.array:
        z0, z1 = split_channels(z)
        h = self.proj(self.convs(self.pre(z0) + condition))  # (B, T, 3K - 1)
        scale = math.sqrt(self.filter_channels)
        z1 = inverse_rational_quadratic(
            z1[..., 0],
            h[..., :NUM_BINS] / scale,
            h[..., NUM_BINS : 2 * NUM_BINS] / scale,
            h[..., 2 * NUM_BINS :],
            tail_bound=TAIL_BOUND,
        )
        return mx.concatenate([z0, z1[..., None]], axis=-1)


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.m = mx.zeros((channels,))
        self.logs = mx.zeros((channels,))

    def reverse(self, z: mx.array) -> mx.array:
        return (z - self.m) * mx.exp(-self.logs)


class StochasticDurationPredictor(nn.Module):
    """Encoder hidden (1, T, C), noise (1, T, 2) and speaker embedding (1, 1, G) or None
    -> log-durations (1, T, 1) in frames."""

    def __init__(
        self, channels: int, kernel_size: int, num_spline_flows: int, speaker_channels: int = 0
    ):
        """The reference's `flows.0` is `affine` here, and its coupling flows used in
        reverse (`flows.3`, `flows.5`, ...) are `spline_flows` in the same order.
        `speaker_channels` is the speaker embedding's width; 0 for one speaker."""
        super().__init__()
        self.pre = Conv1d(channels, channels, 1)
        if speaker_channels:
            self.cond = Conv1d(speaker_channels, channels, 1)
        self.convs = DilatedDepthSeparableConv(channels, kernel_size, num_layers=3)
        self.proj = Conv1d(channels, channels, 1)
        self.affine = ElementwiseAffine(2)
        self.spline_flows = [
            ConvFlow(channels, kernel_size, num_layers=3) for _ in range(num_spline_flows)
        ]

    def __call__(self, x: mx.array, noise: mx.array, speaker: mx.array | None) -> mx.array:
        x = self.pre(x)
        if speaker is not None:
            x = x + self.cond(speaker)
        condition = self.proj(self.convs(x))
        z = noise
        for flow in reversed(self.spline_flows):
            z = flow.reverse(z[..., ::-1], condition)
        z = self.affine.reverse(z[..., ::-1])
        return z[..., :1]


class DurationPredictor(nn.Module):
    """Encoder hidden (1, T, C) and speaker embedding (1, 1, G) or None -> log-durations
    (1, T, 1) in frames: conv -> ReLU -> norm, twice, then a 1x1 projection."""

    def __init__(
        self, channels: int, filter_channels: int, kernel_size: int, speaker_channels: int = 0
    ):
        super().__init__()
        padding = kernel_size // 2
        self.conv_1 = Conv1d(channels, filter_channels, kernel_size, padding=padding)
        self.norm_1 = LayerNorm(filter_channels)
        self.conv_2 = Conv1d(filter_channels, filter_channels, kernel_size, padding=padding)
        self.norm_2 = LayerNorm(filter_channels)
        self.proj = Conv1d(filter_channels, 1, 1)
        if speaker_channels:
            self.cond = Conv1d(speaker_channels, channels, 1)

    def __call__(self, x: mx.array, speaker: mx.array | None) -> mx.array:
        if speaker is not None:
            x = x + self.cond(speaker)
        x = self.norm_1(nn.relu(self.conv_1(x)))
        x = self.norm_2(nn.relu(self.conv_2(x)))
        return self.proj(x)
