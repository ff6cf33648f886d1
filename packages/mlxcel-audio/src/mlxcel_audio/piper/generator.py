"""HiFi-GAN generator: latent frames -> waveform.

Kong et al. 2020, "HiFi-GAN"; ported from Piper's `vits/models.py` (`Generator`) and
`vits/modules.py` (`ResBlock1`, which Piper's "high" quality voices use, and `ResBlock2`,
its other voices'). Weight normalization is folded into the weights at export. A
multi-speaker voice adds its speaker embedding, through `cond`, after the first convolution.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxcel_audio.piper.layers import Conv1d, ConvTranspose1d
from mlxcel_audio.piper.weights import ConvSpec

LRELU_SLOPE = 0.1


class ResBlock1(nn.Module):
    """Residual pairs of a dilated and an undilated convolution, each after a leaky ReLU."""

    def __init__(
        self, channels: int, kernel_size: int, specs1: list[ConvSpec], specs2: list[ConvSpec]
    ):
        super().__init__()
        self.convs1 = [
            Conv1d(channels, channels, kernel_size, padding=spec.padding, dilation=spec.dilation)
            for spec in specs1
        ]
        self.convs2 = [
            Conv1d(channels, channels, kernel_size, padding=spec.padding, dilation=spec.dilation)
            for spec in specs2
        ]

    def __call__(self, x: mx.array) -> mx.array:
        for conv1, conv2 in zip(self.convs1, self.convs2, strict=True):
            y = conv1.channels_first(nn.leaky_relu(x, LRELU_SLOPE))
            x = x + conv2.channels_first(nn.leaky_relu(y, LRELU_SLOPE))
        return x


class ResBlock2(nn.Module):
    """Residual dilated convolutions, each after a leaky ReLU."""

    def __init__(self, channels: int, kernel_size: int, specs: list[ConvSpec]):
        super().__init__()
        self.convs = [
            Conv1d(channels, channels, kernel_size, padding=spec.padding, dilation=spec.dilation)
            for spec in specs
        ]

    def __call__(self, x: mx.array) -> mx.array:
        for conv in self.convs:
            x = x + conv.channels_first(nn.leaky_relu(x, LRELU_SLOPE))
        return x


class Generator(nn.Module):
    """Latent (1, T, C) and speaker embedding (1, 1, G) or None -> waveform
    (1, T * prod(upsample strides)) in [-1, 1].

    Runs channels first, (1, C, T), where the upsampled signal's shifted copies are whole
    rows (`Conv1d.channels_first`)."""

    def __init__(
        self,
        in_channels: int,
        pre: tuple[int, int, ConvSpec],
        ups: list[tuple[int, int, int, ConvSpec]],
        resblocks: list[ResBlock1] | list[ResBlock2],
        post: tuple[int, ConvSpec],
        speaker_channels: int = 0,
    ):
        """pre: (channels, kernel, spec); ups: (in, out, kernel, spec) each;
        resblocks: len(ups) groups of equal size in order; post: (kernel, spec) of the
        bias-free output convolution; speaker_channels: the speaker embedding's width, 0
        for one speaker."""
        super().__init__()
        channels, kernel, spec = pre
        self.conv_pre = Conv1d(in_channels, channels, kernel, padding=spec.padding)
        self.ups = [
            ConvTranspose1d(c_in, c_out, k, stride=s.stride, padding=s.padding)
            for c_in, c_out, k, s in ups
        ]
        if speaker_channels:
            self.cond = Conv1d(speaker_channels, channels, 1)
        self.resblocks = resblocks
        self.num_kernels = len(resblocks) // len(ups)
        kernel, spec = post
        self.conv_post = Conv1d(ups[-1][1], 1, kernel, padding=spec.padding, bias=False)

    def __call__(self, x: mx.array, speaker: mx.array | None) -> mx.array:
        x = self.conv_pre.channels_first(x.transpose(0, 2, 1))
        if speaker is not None:
            x = x + self.cond(speaker).transpose(0, 2, 1)
        n = self.num_kernels
        for i, up in enumerate(self.ups):
            x = up(nn.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * n : (i + 1) * n]
            # Evaluating each branch as it is summed frees its shifted copies before the
            # next branch makes its own: half the peak memory at no cost in time (1,235 MiB
            # against 637 MiB for 9.7 s of audio, docs/adr/0009-piper-long-sentences.md).
            y = blocks[0](x)
            mx.eval(y)
            for block in blocks[1:]:
                y = y + block(x)
                mx.eval(y)
            x = y / n
        x = self.conv_post.channels_first(nn.leaky_relu(x, 0.01))
        return mx.tanh(x[:, 0])
