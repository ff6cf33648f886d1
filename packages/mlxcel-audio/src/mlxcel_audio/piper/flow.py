"""VITS normalizing flow, run in reverse: prior sample z_p -> latent z.

Kim et al. 2021 (VITS), section 2.1.3; ported from Piper's `vits/models.py`
(`ResidualCouplingBlock`) and `vits/modules.py` (`ResidualCouplingLayer` with mean only,
`WN`, `Flip`). Weight normalization is folded into the weights at export. A multi-speaker
voice's speaker embedding enters each WaveNet layer's gate through `cond_layer`.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxcel_audio.piper.layers import Conv1d, split_channels
from mlxcel_audio.piper.weights import ConvSpec


class WaveNet(nn.Module):
    """Non-causal WaveNet: gated dilated convolutions with residual and skip outputs, each
    gate offset by the speaker embedding's share for its layer when there is one."""

    def __init__(
        self, channels: int, kernel_size: int, specs: list[ConvSpec], speaker_channels: int = 0
    ):
        super().__init__()
        self.channels = channels
        last = len(specs) - 1
        if speaker_channels:
            self.cond_layer = Conv1d(speaker_channels, 2 * channels * len(specs), 1)
        self.in_layers = [
            Conv1d(
                channels,
                2 * channels,
                kernel_size,
                padding=spec.padding,
                dilation=spec.dilation,
            )
            for spec in specs
        ]
        self.res_skip_layers = [
            Conv1d(channels, channels if i == last else 2 * channels, 1) for i in range(len(specs))
        ]

    def __call__(self, x: mx.array, speaker: mx.array | None) -> mx.array:
        C = self.channels
        output = mx.zeros_like(x)
        last = len(self.in_layers) - 1
        gates = None if speaker is None else self.cond_layer(speaker)  # (1, 1, 2C * layers)
        for i, (in_layer, res_skip) in enumerate(
            zip(self.in_layers, self.res_skip_layers, strict=True)
        ):
            h = in_layer(x)
            if gates is not None:
                h = h + gates[..., 2 * C * i : 2 * C * (i + 1)]
            acts = mx.tanh(h[..., :C]) * mx.sigmoid(h[..., C:])
            h = res_skip(acts)
            if i == last:
                output = output + h
            else:
                x = x + h[..., :C]
                output = output + h[..., C:]
        return output


class ResidualCoupling(nn.Module):
    """Affine coupling (mean only): the second half is shifted by a WaveNet of the first."""

    def __init__(
        self,
        channels: int,
        hidden_channels: int,
        kernel_size: int,
        specs: list[ConvSpec],
        speaker_channels: int = 0,
    ):
        super().__init__()
        half = channels // 2
        self.pre = Conv1d(half, hidden_channels, 1)
        self.enc = WaveNet(hidden_channels, kernel_size, specs, speaker_channels)
        self.post = Conv1d(hidden_channels, half, 1)

    def reverse(self, z: mx.array, speaker: mx.array | None) -> mx.array:
        z0, z1 = split_channels(z)
        mean = self.post(self.enc(self.pre(z0), speaker))
        return mx.concatenate([z0, z1 - mean], axis=-1)


class ResidualCouplingBlock(nn.Module):
    """Coupling layers, each followed by a channel flip; (1, T, C) and the speaker embedding
    (1, 1, G) or None -> (1, T, C).

    The reference's `flows.0`, `flows.2`, ... (the flips between hold no weights) are
    `couplings.0`, `couplings.1`, ... here."""

    def __init__(self, couplings: list[ResidualCoupling]):
        super().__init__()
        self.couplings = couplings

    def reverse(self, z: mx.array, speaker: mx.array | None) -> mx.array:
        for coupling in reversed(self.couplings):
            z = coupling.reverse(z[..., ::-1], speaker)
        return z
