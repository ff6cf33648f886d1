"""CLIP's vision transformer on MLX, returning the hidden states LLaVA selects.

Reference: Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
Supervision"; transformers' `CLIPVisionModel` (pre-norm encoder layers, a class token,
learned position embeddings, a LayerNorm before the first layer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_vision.activations import activation


@dataclass(frozen=True)
class ClipVisionArgs:
    """A `clip_vision_model` config's hyperparameters."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ClipVisionArgs:
        return cls(**{name: config[name] for name in cls.__dataclass_fields__ if name in config})

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class ClipAttention(nn.Module):
    def __init__(self, args: ClipVisionArgs):
        super().__init__()
        dim = args.hidden_size
        self.num_heads = args.num_attention_heads
        self.scale = (dim // self.num_heads) ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        B, L, D = x.shape
        H = self.num_heads
        queries, keys, values = (
            projection(x).reshape(B, L, H, D // H).transpose(0, 2, 1, 3)
            for projection in (self.q_proj, self.k_proj, self.v_proj)
        )
        output = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale)
        return self.out_proj(output.transpose(0, 2, 1, 3).reshape(B, L, D))


class ClipMLP(nn.Module):
    def __init__(self, args: ClipVisionArgs):
        super().__init__()
        self.activation: Callable[[mx.array], mx.array] = activation(args.hidden_act)
        self.fc1 = nn.Linear(args.hidden_size, args.intermediate_size)
        self.fc2 = nn.Linear(args.intermediate_size, args.hidden_size)

    def __call__(self, x: mx.array) -> mx.array:
        return self.fc2(self.activation(self.fc1(x)))


class ClipEncoderLayer(nn.Module):
    def __init__(self, args: ClipVisionArgs):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.self_attn = ClipAttention(args)
        self.layer_norm2 = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.mlp = ClipMLP(args)

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class ClipEncoder(nn.Module):
    def __init__(self, args: ClipVisionArgs):
        super().__init__()
        self.layers = [ClipEncoderLayer(args) for _ in range(args.num_hidden_layers)]


class ClipEmbeddings(nn.Module):
    """Patches (a strided convolution, MLX's channels-last layout), a class token in front,
    and a learned embedding per position."""

    def __init__(self, args: ClipVisionArgs):
        super().__init__()
        self.class_embedding = mx.zeros((args.hidden_size,))
        self.patch_embedding = nn.Conv2d(
            args.num_channels,
            args.hidden_size,
            kernel_size=args.patch_size,
            stride=args.patch_size,
            bias=False,
        )
        self.position_embedding = nn.Embedding(args.num_patches + 1, args.hidden_size)

    def __call__(self, pixels: mx.array) -> mx.array:
        patches = self.patch_embedding(pixels)
        B, rows, columns, D = patches.shape
        patches = patches.reshape(B, rows * columns, D)
        class_token = mx.broadcast_to(self.class_embedding, (B, 1, D)).astype(patches.dtype)
        return mx.concatenate([class_token, patches], axis=1) + self.position_embedding.weight


class ClipVisionTower(nn.Module):
    """CLIP's vision transformer without its pooling head (`post_layernorm`), which LLaVA
    never reads."""

    def __init__(self, args: ClipVisionArgs):
        super().__init__()
        self.embeddings = ClipEmbeddings(args)
        self.pre_layrnorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.encoder = ClipEncoder(args)

    def __call__(self, pixels: mx.array, layers: Sequence[int]) -> list[mx.array]:
        """Hidden states of `pixels`, running only the layers they need.

        Args:
            pixels: (B, image_size, image_size, channels) normalized pixel values.
            layers: indices into transformers' `hidden_states` (0: the embeddings after
                `pre_layrnorm`, i: the output of encoder layer i); each in
                [0, num_hidden_layers].

        Returns:
            The (B, num_patches + 1, hidden) states at `layers`, in that order.
        """
        states = [self.pre_layrnorm(self.embeddings(pixels))]
        for layer in self.encoder.layers[: max(layers)]:
            states.append(layer(states[-1]))
        return [states[index] for index in layers]
