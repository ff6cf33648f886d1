"""The parts of an Idefics3 / SmolVLM `config.json` the MLX modules are built from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import AutoConfig

from mlxcel_models.errors import ModelLoadError


@dataclass(frozen=True)
class VisionConfig:
    """The SigLIP-style vision tower (`vision_config`).

    Attributes:
        hidden_size: width of the tower's activations.
        intermediate_size: width of its MLP.
        num_layers: encoder layers.
        num_heads: attention heads.
        image_size: side of the square tile the tower takes, pixels.
        patch_size: side of a patch, pixels.
        num_channels: input channels (3, RGB).
        layer_norm_eps: epsilon of the layer norms.
        hidden_act: the MLP's activation, as transformers names it.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


@dataclass(frozen=True)
class Idefics3Config:
    """The whole model's configuration.

    Attributes:
        vision: the vision tower.
        scale_factor: the connector's pixel-shuffle factor: each output token gathers a
            `scale_factor` x `scale_factor` block of patches.
        image_token_id: the placeholder token's id.
        tie_word_embeddings: the LM head is the embedding table.
    """

    vision: VisionConfig
    scale_factor: int
    image_token_id: int
    tie_word_embeddings: bool

    @property
    def image_seq_len(self) -> int:
        """Placeholder tokens per tile: patches per tile over `scale_factor` squared."""
        return self.vision.patches_per_side**2 // self.scale_factor**2

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> Idefics3Config:
        """Read a `config.json` as transformers or mlx-vlm writes it.

        Published configs leave out the vision settings that equal transformers' defaults,
        so the config is read through transformers' config class for its `model_type`
        (`Idefics3Config`, `SmolVLMConfig`), which fills them in.

        Raises:
            ModelLoadError: transformers rejects the config, or the tile does not split
                into whole pixel-shuffle blocks.
        """
        settings = {key: value for key, value in config.items() if key != "model_type"}
        try:
            parsed = AutoConfig.for_model(config["model_type"], **settings)
        # transformers' config classes validate types and values as they are built.
        except (KeyError, ValueError, TypeError) as error:
            raise ModelLoadError(f"not a valid Idefics3 config: {error}") from error
        vision = parsed.vision_config
        vision_config = VisionConfig(
            hidden_size=vision.hidden_size,
            intermediate_size=vision.intermediate_size,
            num_layers=vision.num_hidden_layers,
            num_heads=vision.num_attention_heads,
            image_size=vision.image_size,
            patch_size=vision.patch_size,
            num_channels=vision.num_channels,
            layer_norm_eps=vision.layer_norm_eps,
            hidden_act=vision.hidden_act,
        )
        if vision_config.patches_per_side % parsed.scale_factor:
            raise ModelLoadError(
                f"the Idefics3 tile of {vision_config.patches_per_side} patches a side does "
                f"not split into blocks of scale_factor {parsed.scale_factor}"
            )
        return cls(
            vision=vision_config,
            scale_factor=parsed.scale_factor,
            image_token_id=parsed.image_token_id,
            tie_word_embeddings=parsed.tie_word_embeddings,
        )
