"""LLaVA: a CLIP vision tower, a two-layer MLP projector and a text model.

Reference: Liu et al. 2023, "Visual Instruction Tuning" and "Improved Baselines with
Visual Instruction Tuning" (LLaVA 1.5); transformers' `LlavaForConditionalGeneration`.
LLaVA-NeXT (anyres.py) has the same parts and one more weight, `image_newline`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcel_models.errors import ModelLoadError
from mlxcel_vision.activations import activation
from mlxcel_vision.families.llava.clip import ClipVisionArgs, ClipVisionTower

SELECT_STRATEGIES = ("default", "full")


@dataclass(frozen=True)
class LlavaArgs:
    """What a `llava` config says about turning an image into text-model features.

    Attributes:
        vision: the CLIP tower's hyperparameters.
        text_hidden_size: the text model's embedding width.
        feature_layers: the tower's hidden states concatenated as features, as indices into
            transformers' `hidden_states` (negative ones count from the end).
        select_strategy: "default" drops the class token's position, "full" keeps it.
        projector_act: the projector's activation.
        projector_bias: whether the projector's layers have biases.
        image_token_id: the placeholder token's id.
    """

    vision: ClipVisionArgs
    text_hidden_size: int
    feature_layers: tuple[int, ...]
    select_strategy: str
    projector_act: str
    projector_bias: bool
    image_token_id: int

    @classmethod
    def from_config(
        cls, config: dict[str, Any], vision_config: dict[str, Any], text_hidden_size: int
    ) -> LlavaArgs:
        """Read a complete `llava` config (transformers' defaults filled in).

        Raises:
            ModelLoadError: a feature layer lies outside the tower, or the select strategy
                is unknown.
        """
        vision = ClipVisionArgs.from_config(vision_config)
        layers = config["vision_feature_layer"]
        layers = (layers,) if isinstance(layers, int) else tuple(layers)
        num_states = vision.num_hidden_layers + 1
        if not all(-num_states <= layer < num_states for layer in layers):
            raise ModelLoadError(
                f"vision_feature_layer {config['vision_feature_layer']} lies outside a "
                f"tower of {vision.num_hidden_layers} layers"
            )
        strategy = config["vision_feature_select_strategy"]
        if strategy not in SELECT_STRATEGIES:
            raise ModelLoadError(
                f"vision_feature_select_strategy must be one of {SELECT_STRATEGIES}, "
                f"got {strategy!r}"
            )
        return cls(
            vision=vision,
            text_hidden_size=text_hidden_size,
            feature_layers=tuple(layer % num_states for layer in layers),
            select_strategy=strategy,
            projector_act=config["projector_hidden_act"],
            projector_bias=bool(config.get("multimodal_projector_bias", True)),
            image_token_id=int(config["image_token_index"]),
        )

    @property
    def num_image_tokens(self) -> int:
        """Tokens one image fills."""
        patches = self.vision.num_patches
        return patches if self.select_strategy == "default" else patches + 1


class LlavaProjector(nn.Module):
    def __init__(self, args: LlavaArgs):
        super().__init__()
        features = args.vision.hidden_size * len(args.feature_layers)
        self.activation: Callable[[mx.array], mx.array] = activation(args.projector_act)
        self.linear_1 = nn.Linear(features, args.text_hidden_size, bias=args.projector_bias)
        self.linear_2 = nn.Linear(
            args.text_hidden_size, args.text_hidden_size, bias=args.projector_bias
        )

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_2(self.activation(self.linear_1(x)))


class LlavaModel(nn.Module):
    """Every weight of a LLaVA model, named as `checkpoint.llava_weights` maps them.

    Args:
        args: the model's settings.
        language_model: the mlx-lm text model.
        image_newline: hold LLaVA-NeXT's learned embedding that ends each row of an
            image's feature map.
    """

    def __init__(self, args: LlavaArgs, language_model: nn.Module, *, image_newline: bool):
        super().__init__()
        self.vision_tower = ClipVisionTower(args.vision)
        self.multi_modal_projector = LlavaProjector(args)
        self.language_model = language_model
        if image_newline:
            self.image_newline = mx.zeros((args.text_hidden_size,))


def select_features(model: LlavaModel, args: LlavaArgs, pixels: np.ndarray) -> mx.array:
    """Tower, feature selection and projector on a batch of tower-sized pictures.

    Args:
        pixels: (N, image_size, image_size, 3) float32 normalized pixels.

    Returns:
        (N, num_image_tokens, text_hidden_size) features in the tower's float dtype.
    """
    dtype = model.vision_tower.pre_layrnorm.weight.dtype
    states = model.vision_tower(mx.array(pixels).astype(dtype), args.feature_layers)
    if args.select_strategy == "default":
        states = [state[:, 1:] for state in states]
    return model.multi_modal_projector(mx.concatenate(states, axis=-1))


class LlavaImageEncoder:
    """LLaVA's `VisionEncoder`: tower, feature selection, projector."""

    def __init__(self, model: LlavaModel, args: LlavaArgs) -> None:
        self._model = model
        self._args = args

    def __call__(self, inputs: np.ndarray) -> mx.array:
        """Encode (image_size, image_size, 3) float32 normalized pixels.

        Returns:
            (num_image_tokens, text_hidden_size) features in the tower's float dtype.
        """
        return select_features(self._model, self._args, inputs[None])[0]
