"""Building blocks shared by the VITS parts: channels last `(B, T, C)` as MLX convolves,
except in the HiFi-GAN decoder, which runs channels first `(B, C, T)`.

The convolutions keep `mlx.nn`'s parameter layout but run as matrix products over shifted
views of the input: on the CPU that goes through BLAS, where MLX's own `conv1d` and
`conv_transpose1d` measured 13x and 15x slower at HiFi-GAN's shapes
(docs/adr/0008-piper-convolutions-as-matmuls.md).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class LayerNorm(nn.Module):
    """Layer norm over channels with VITS's parameter names (`gamma`, `beta`)."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = mx.ones((channels,))
        self.beta = mx.zeros((channels,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.layer_norm(x, self.gamma, self.beta, self.eps)


class Conv1d(nn.Module):
    """Stride-1 1-D convolution, (B, T, in) -> (B, T + 2 * padding - dilation * (k - 1), out).

    Weight (out, k, in) as `mlx.nn.Conv1d`; `groups` is 1 or `in` (depthwise).

    Raises:
        ValueError: `groups` is neither 1 nor the number of input channels.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
    ):
        super().__init__()
        if groups not in (1, in_channels):
            raise ValueError(f"groups must be 1 or in_channels ({in_channels}), got {groups}")
        self.padding = padding
        self.dilation = dilation
        self.depthwise = groups > 1
        self.weight = mx.zeros((out_channels, kernel_size, in_channels // groups))
        if bias:
            self.bias = mx.zeros((out_channels,))

    def __call__(self, x: mx.array) -> mx.array:
        out_channels, kernel_size, _ = self.weight.shape
        if self.padding:
            x = mx.pad(x, ((0, 0), (self.padding, self.padding), (0, 0)))
        length = x.shape[1] - self.dilation * (kernel_size - 1)
        shifted = [x[:, i * self.dilation : i * self.dilation + length] for i in range(kernel_size)]
        if self.depthwise:
            y = shifted[0] * self.weight[:, 0, 0]
            for i in range(1, kernel_size):
                y = y + shifted[i] * self.weight[:, i, 0]
        else:
            columns = shifted[0] if kernel_size == 1 else mx.concatenate(shifted, axis=-1)
            y = columns @ self.weight.reshape(out_channels, -1).T
        return y + self.bias if "bias" in self else y

    def channels_first(self, x: mx.array) -> mx.array:
        """The same convolution on (B, in, T) -> (B, out, T'), not depthwise. At long T and
        few channels the shifted copies are then whole rows: 1.3-1.9x faster measured."""
        out_channels, kernel_size, _ = self.weight.shape
        if self.padding:
            x = mx.pad(x, ((0, 0), (0, 0), (self.padding, self.padding)))
        length = x.shape[2] - self.dilation * (kernel_size - 1)
        shifted = [
            x[:, :, i * self.dilation : i * self.dilation + length] for i in range(kernel_size)
        ]
        columns = shifted[0] if kernel_size == 1 else mx.concatenate(shifted, axis=1)
        y = self.weight.reshape(out_channels, -1) @ columns
        return y + self.bias[:, None] if "bias" in self else y


class ConvTranspose1d(nn.Module):
    """1-D transposed convolution, channels first: (B, in, T) -> (B, out, T'), where
    T' = (T - 1) * stride - 2 * padding + k.

    Weight (out, k, in) as `mlx.nn.ConvTranspose1d`. One matrix product gives every input
    frame's k output samples; frames then overlap-add in k / stride shifted blocks.

    Raises:
        ValueError: the kernel size is not a multiple of the stride.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, *, stride: int, padding: int
    ):
        super().__init__()
        if kernel_size % stride:
            raise ValueError(
                f"kernel_size must be a multiple of stride ({stride}), got {kernel_size}"
            )
        self.stride = stride
        self.padding = padding
        self.weight = mx.zeros((out_channels, kernel_size, in_channels))
        self.bias = mx.zeros((out_channels,))

    def __call__(self, x: mx.array) -> mx.array:
        B, C, T = x.shape
        out_channels, kernel_size, _ = self.weight.shape
        s, blocks = self.stride, kernel_size // self.stride
        w = self.weight.transpose(1, 0, 2).reshape(kernel_size * out_channels, C)
        # (B, k * out, T) -> (B, blocks, out, T, s): sample j of block b lands at t * s + j + b * s.
        y = (w @ x).reshape(B, blocks, s, out_channels, T).transpose(0, 1, 3, 4, 2)
        out = mx.pad(y[:, 0], ((0, 0), (0, 0), (0, blocks - 1), (0, 0)))
        for b in range(1, blocks):
            out = out + mx.pad(y[:, b], ((0, 0), (0, 0), (b, blocks - 1 - b), (0, 0)))
        out = out.reshape(B, out_channels, (T + blocks - 1) * s)
        return out[:, :, self.padding : out.shape[2] - self.padding] + self.bias[:, None]


def split_channels(x: mx.array) -> tuple[mx.array, mx.array]:
    """The two halves of the channel axis, as the coupling flows split them."""
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]
