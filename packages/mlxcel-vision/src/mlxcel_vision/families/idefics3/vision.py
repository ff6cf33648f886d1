"""Idefics3's vision tower and connector on MLX.

The tower is SigLIP with NaViT-style position embeddings (transformers'
`Idefics3VisionTransformer`); the connector pixel-shuffles its output and projects it into
the text model's embedding space (`Idefics3Connector`). Reference: transformers
`models/idefics3/modeling_idefics3.py`; Laurençon et al. 2024, "Building and better
understanding vision-language models".
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxcel_vision.activations import activation
from mlxcel_vision.families.idefics3.config import Idefics3Config, VisionConfig


class VisionEmbeddings(nn.Module):
    """Patch embedding (a strided convolution) plus learned position embeddings.

    Idefics3 buckets each patch's fractional position in its image onto the
    `patches_per_side`² learned positions. The processor only ever gives the tower whole
    `image_size` tiles, so every tile's grid is the full one and patch (i, j) takes
    position i * patches_per_side + j, the exact value of that bucketing. (transformers
    computes it in float32, whose rounding moves some patches for grids such as 19 or 25
    a side; the intended arithmetic is kept here.)
    """

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(
            config.num_channels,
            config.hidden_size,
            kernel_size=config.patch_size,
            stride=config.patch_size,
        )
        self.position_embedding = nn.Embedding(config.patches_per_side**2, config.hidden_size)

    def __call__(self, pixels: mx.array) -> mx.array:
        """(B, H, W, C) pixels -> (B, patches, hidden) embeddings."""
        patches = self.patch_embedding(pixels)
        B, rows, cols, D = patches.shape
        embeddings = patches.reshape(B, rows * cols, D)
        return embeddings + self.position_embedding(mx.arange(rows * cols))


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        D = config.hidden_size
        self.num_heads = config.num_heads
        self.scale = (D // config.num_heads) ** -0.5
        self.q_proj = nn.Linear(D, D)
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

    def __call__(self, x: mx.array) -> mx.array:
        B, L, D = x.shape
        queries, keys, values = (
            proj(x).reshape(B, L, self.num_heads, -1).transpose(0, 2, 1, 3)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        output = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale)
        return self.out_proj(output.transpose(0, 2, 1, 3).reshape(B, L, D))


class VisionMLP(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.activation = activation(config.hidden_act)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(self.activation(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = VisionMLP(config)

    def __call__(self, x: mx.array) -> mx.array:
        h = x + self.self_attn(self.layer_norm1(x))
        return h + self.mlp(self.layer_norm2(h))


class Encoder(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.layers = [EncoderLayer(config) for _ in range(config.num_layers)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x


class VisionTransformer(nn.Module):
    """The tower: (B, H, W, C) tiles -> (B, patches, vision hidden) features."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.embeddings = VisionEmbeddings(config)
        self.encoder = Encoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def __call__(self, pixels: mx.array) -> mx.array:
        return self.post_layernorm(self.encoder(self.embeddings(pixels)))


def pixel_shuffle(x: mx.array, scale_factor: int) -> mx.array:
    """Fold each `scale_factor`² block of a square patch grid into one token.

    (B, S, D) -> (B, S / scale_factor², D * scale_factor²), with transformers' ordering
    of the folded features (`Idefics3Connector.pixel_shuffle`).
    """
    B, S, D = x.shape
    side = int(S**0.5)
    folded = side // scale_factor
    x = x.reshape(B, side, folded, D * scale_factor)
    x = x.transpose(0, 2, 1, 3).reshape(B, folded, folded, D * scale_factor**2)
    return x.transpose(0, 2, 1, 3).reshape(B, folded * folded, D * scale_factor**2)


class ModalityProjection(nn.Module):
    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_size, output_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.proj(x)


class Connector(nn.Module):
    """Pixel shuffle, then a linear projection to the text model's hidden size."""

    def __init__(self, config: Idefics3Config, text_hidden_size: int) -> None:
        super().__init__()
        self.scale_factor = config.scale_factor
        self.modality_projection = ModalityProjection(
            config.vision.hidden_size * config.scale_factor**2, text_hidden_size
        )

    def __call__(self, features: mx.array) -> mx.array:
        return self.modality_projection(pixel_shuffle(features, self.scale_factor))


class Idefics3VisionEncoder(nn.Module):
    """The `VisionEncoder`: one tile's pixels to its placeholder tokens' embeddings.

    Args:
        config: the model's configuration.
        text_hidden_size: the text model's hidden size.

    Raises:
        ModelLoadError: the vision tower's activation is not one mlxcel implements.
    """

    def __init__(self, config: Idefics3Config, text_hidden_size: int) -> None:
        super().__init__()
        self.vision_model = VisionTransformer(config.vision)
        self.connector = Connector(config, text_hidden_size)

    def __call__(self, inputs: mx.array) -> mx.array:
        """Encode one tile.

        Args:
            inputs: (image_size, image_size, channels) float32 normalised pixels.

        Returns:
            (image_seq_len, text_hidden_size) features in the activation dtype.
        """
        # A norm's weight has the activation dtype also where linear layers are quantized.
        dtype = self.vision_model.post_layernorm.weight.dtype
        features = self.vision_model(inputs[None].astype(dtype))
        return self.connector(features)[0]
