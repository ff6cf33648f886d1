"""VITS text encoder: phoneme embedding, Transformer layers with windowed relative-position
self-attention and convolutional feed-forward, then the prior's mean and log-scale.

Reference: Kim et al. 2021 (VITS), and Piper's `vits/attentions.py` / `vits/models.py`
(`TextEncoder`, `Encoder`, `MultiHeadAttention`, `FFN`); dropout is gone at inference.
A single sequence is encoded at a time, so there is no padding mask.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from mlxcel_audio.piper.layers import Conv1d, LayerNorm


class RelativeAttention(nn.Module):
    """Multi-head self-attention with relative position embeddings shared by all heads,
    clipped to `window_size` positions on each side (Shaw et al. 2018)."""

    def __init__(self, channels: int, num_heads: int, window_size: int):
        super().__init__()
        self.num_heads = num_heads
        self.window_size = window_size
        head_dim = channels // num_heads
        self.conv_q = Conv1d(channels, channels, 1)
        self.conv_k = Conv1d(channels, channels, 1)
        self.conv_v = Conv1d(channels, channels, 1)
        self.conv_o = Conv1d(channels, channels, 1)
        self.emb_rel_k = mx.zeros((1, 2 * window_size + 1, head_dim))
        self.emb_rel_v = mx.zeros((1, 2 * window_size + 1, head_dim))

    def __call__(self, x: mx.array) -> mx.array:
        B, L, C = x.shape
        H = self.num_heads
        D = C // H

        def heads(t: mx.array) -> mx.array:
            return t.reshape(B, L, H, D).transpose(0, 2, 1, 3)

        q = heads(self.conv_q(x)) / math.sqrt(D)
        k = heads(self.conv_k(x))
        v = heads(self.conv_v(x))
        rel_k = self._relative_embeddings(self.emb_rel_k, L)  # (1, 2L-1, D)
        scores = q @ k.swapaxes(-1, -2) + _relative_to_absolute(q @ rel_k.swapaxes(-1, -2))
        weights = mx.softmax(scores, axis=-1, precise=True)
        rel_v = self._relative_embeddings(self.emb_rel_v, L)
        out = weights @ v + _absolute_to_relative(weights) @ rel_v
        return self.conv_o(out.transpose(0, 2, 1, 3).reshape(B, L, C))

    def _relative_embeddings(self, table: mx.array, length: int) -> mx.array:
        """Rows for relative positions -(length-1) .. length-1, zero beyond the window."""
        pad = max(length - (self.window_size + 1), 0)
        start = max(self.window_size + 1 - length, 0)
        if pad:
            table = mx.pad(table, ((0, 0), (pad, pad), (0, 0)))
        return table[:, start : start + 2 * length - 1]


def _relative_to_absolute(x: mx.array) -> mx.array:
    """(B, H, L, 2L-1) logits by relative position -> (B, H, L, L) by key position."""
    B, H, L, _ = x.shape
    x = mx.pad(x, ((0, 0), (0, 0), (0, 0), (0, 1))).reshape(B, H, 2 * L * L)
    x = mx.pad(x, ((0, 0), (0, 0), (0, L - 1)))
    return x.reshape(B, H, L + 1, 2 * L - 1)[:, :, :L, L - 1 :]


def _absolute_to_relative(x: mx.array) -> mx.array:
    """(B, H, L, L) weights by key position -> (B, H, L, 2L-1) by relative position."""
    B, H, L, _ = x.shape
    x = mx.pad(x, ((0, 0), (0, 0), (0, 0), (0, L - 1))).reshape(B, H, L * (2 * L - 1))
    x = mx.pad(x, ((0, 0), (0, 0), (L, 0)))
    return x.reshape(B, H, L, 2 * L)[:, :, :, 1:]


class FeedForward(nn.Module):
    """conv -> ReLU -> conv, each convolution "same"-padded along time."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.padding = ((0, 0), ((kernel_size - 1) // 2, kernel_size // 2), (0, 0))
        self.conv_1 = Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = Conv1d(filter_channels, channels, kernel_size)

    def __call__(self, x: mx.array) -> mx.array:
        x = nn.relu(self.conv_1(mx.pad(x, self.padding)))
        return self.conv_2(mx.pad(x, self.padding))


class Encoder(nn.Module):
    def __init__(
        self,
        channels: int,
        filter_channels: int,
        num_heads: int,
        num_layers: int,
        kernel_size: int,
        window_size: int,
    ):
        super().__init__()
        self.attn_layers = [
            RelativeAttention(channels, num_heads, window_size) for _ in range(num_layers)
        ]
        self.norm_layers_1 = [LayerNorm(channels) for _ in range(num_layers)]
        self.ffn_layers = [
            FeedForward(channels, filter_channels, kernel_size) for _ in range(num_layers)
        ]
        self.norm_layers_2 = [LayerNorm(channels) for _ in range(num_layers)]

    def __call__(self, x: mx.array) -> mx.array:
        for attn, norm_1, ffn, norm_2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2, strict=True
        ):
            x = norm_1(x + attn(x))
            x = norm_2(x + ffn(x))
        return x


class TextEncoder(nn.Module):
    """Phoneme ids (1, T) int -> hidden (1, T, hidden), prior mean and log-scale (1, T, inter)."""

    def __init__(
        self,
        num_symbols: int,
        inter_channels: int,
        hidden_channels: int,
        filter_channels: int,
        num_heads: int,
        num_layers: int,
        kernel_size: int,
        window_size: int,
    ):
        super().__init__()
        self.hidden_channels = hidden_channels
        self.emb = nn.Embedding(num_symbols, hidden_channels)
        self.encoder = Encoder(
            hidden_channels, filter_channels, num_heads, num_layers, kernel_size, window_size
        )
        self.proj = Conv1d(hidden_channels, 2 * inter_channels, 1)

    def __call__(self, phoneme_ids: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        x = self.emb(phoneme_ids) * math.sqrt(self.hidden_channels)
        x = self.encoder(x)
        mean, log_scale = mx.split(self.proj(x), 2, axis=-1)
        return x, mean, log_scale
