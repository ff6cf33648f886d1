"""Qwen2-VL's and Qwen2.5-VL's vision tower on MLX, with the patch merger into the language
model's hidden size.

Reference: transformers' `Qwen2VisionTransformerPretrainedModel` and
`Qwen2_5_VisionTransformerPretrainedModel` (Wang et al. 2024, "Qwen2-VL"; Bai et al. 2025,
"Qwen2.5-VL Technical Report").
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcel_vision.activations import activation
from mlxcel_vision.families.qwen2_vl.attention_groups import (
    AttentionGroups,
    make_attention_groups,
)
from mlxcel_vision.families.qwen2_vl.config import VisionConfig
from mlxcel_vision.families.qwen2_vl.image_inputs import Qwen2VLImageInputs
from mlxcel_vision.families.qwen2_vl.vision_layout import (
    patch_positions,
    window_ids,
    window_order,
)

NORM_EPS = 1e-6


def rotate_half(x: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    return mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class PatchEmbed(nn.Module):
    """The Conv3d over (temporal, height, width) patches, whose stride equals its kernel, as
    one matmul over flattened patches; `proj.weight` is (width, patch_dim)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(config.patch_dim, config.width, bias=False)

    def __call__(self, pixel_values: mx.array) -> mx.array:
        return self.proj(pixel_values)


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.scale = config.head_dim**-0.5
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=True)
        self.proj = nn.Linear(config.width, config.width, bias=True)

    def __call__(
        self, x: mx.array, cos: mx.array, sin: mx.array, groups: AttentionGroups | None
    ) -> mx.array:
        N, D = x.shape
        qkv = self.qkv(x).reshape(N, 3, self.num_heads, -1).transpose(1, 2, 0, 3)
        queries, keys, values = qkv[0:1], qkv[1:2], qkv[2:3]
        queries = queries * cos + rotate_half(queries) * sin
        keys = keys * cos + rotate_half(keys) * sin
        if groups is None:
            output = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale)
            return self.proj(output[0].transpose(1, 0, 2).reshape(N, D))
        # (1, H, N, d) -> (G, H, S, d): one batch row per group.
        queries, keys, values = (
            a[0][:, groups.gather].transpose(1, 0, 2, 3) for a in (queries, keys, values)
        )
        output = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=self.scale, mask=groups.key_mask
        )
        output = output.transpose(0, 2, 1, 3).reshape(-1, D)
        return self.proj(output[groups.slot_of_token])


class QuickGeluMLP(nn.Module):
    """Qwen2-VL's block MLP."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.width, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.width)
        self.act = activation(config.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(self.act(self.fc1(x)))


class GatedMLP(nn.Module):
    """Qwen2.5-VL's block MLP (SwiGLU with biases)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.width, config.intermediate_size)
        self.up_proj = nn.Linear(config.width, config.intermediate_size)
        self.down_proj = nn.Linear(config.intermediate_size, config.width)
        self.act = activation(config.hidden_act)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def _norm(config: VisionConfig, dims: int) -> nn.Module:
    if config.windowed:
        return nn.RMSNorm(dims, eps=NORM_EPS)
    return nn.LayerNorm(dims, eps=NORM_EPS)


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.norm1 = _norm(config, config.width)
        self.norm2 = _norm(config, config.width)
        self.attn = VisionAttention(config)
        self.mlp = GatedMLP(config) if config.windowed else QuickGeluMLP(config)

    def __call__(
        self, x: mx.array, cos: mx.array, sin: mx.array, groups: AttentionGroups | None
    ) -> mx.array:
        x = x + self.attn(self.norm1(x), cos, sin, groups)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Concatenates each merge_size x merge_size block of patches and projects it to the
    language model's hidden size: one token per block."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.merged_size = merged = config.width * config.merge_size**2
        self.ln_q = _norm(config, config.width)
        self.mlp = [nn.Linear(merged, merged), nn.GELU(), nn.Linear(merged, config.out_size)]

    def __call__(self, x: mx.array) -> mx.array:
        x = self.ln_q(x).reshape(-1, self.merged_size)
        for layer in self.mlp:
            x = layer(x)
        return x


class VisionTower(nn.Module):
    """Patch embedding, 2D-RoPE transformer blocks and the patch merger.

    Raises:
        ModelLoadError: the config names an activation the tower does not have.
    """

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.blocks = [VisionBlock(config) for _ in range(config.depth)]
        self.merger = PatchMerger(config)
        rotary_dims = config.head_dim // 2
        self._inv_freq = 1.0 / (
            config.rope_theta ** (np.arange(0, rotary_dims, 2, dtype=np.float32) / rotary_dims)
        )

    def _rotary_tables(self, positions: np.ndarray) -> tuple[mx.array, mx.array]:
        """(1, 1, N, head_dim) cos and sin: the first half of each head's frequencies turn
        with the patch's row, the second with its column, repeated for rotate_half."""
        angles = (positions[:, :, None] * self._inv_freq).reshape(len(positions), -1)
        angles = mx.array(np.concatenate([angles, angles], axis=-1))[None, None]
        return mx.cos(angles), mx.sin(angles)

    def __call__(self, inputs: Qwen2VLImageInputs) -> mx.array:
        """Encode one image.

        Args:
            inputs: its patches and grid, from `Qwen2VLImageProcessor`.

        Returns:
            (t * h * w / merge_size^2, out_size) features, in the weights' dtype.
        """
        config = self.config
        grid = inputs.grid_thw
        t, h, w = grid
        merge_unit = config.merge_size**2
        window = (grid, config.merge_size, config.window_size, config.patch_size)
        # Qwen2.5-VL runs its blocks on merged tokens in window order; Qwen2-VL in image order.
        num_merged = t * h * w // merge_unit
        order = window_order(*window) if config.windowed else np.arange(num_merged)
        patch_order = (order[:, None] * merge_unit + np.arange(merge_unit)).reshape(-1)
        # Frames attend separately; an image is one frame.
        frames = make_attention_groups(patch_order // (h * w))
        if config.windowed:
            windows = make_attention_groups(np.repeat(window_ids(*window), merge_unit))
        else:
            windows = frames
        # A norm weight, never quantized, carries the activation dtype.
        dtype = self.merger.ln_q.weight.dtype
        x = self.patch_embed(mx.array(inputs.pixel_values[patch_order]).astype(dtype))
        cos, sin = self._rotary_tables(patch_positions(grid, config.merge_size)[patch_order])
        cos, sin = cos.astype(dtype), sin.astype(dtype)
        for index, block in enumerate(self.blocks):
            groups = frames if index in config.full_attention_blocks else windows
            x = block(x, cos, sin, groups)
        return self.merger(x)[mx.array(np.argsort(order))]
