"""The parts of an Idefics3 / SmolVLM `config.json` the MLX modules are built from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


@dataclass(frozen=True)
class Idefics3Config:
    """The whole model's configuration.

    Attributes:
        vision: the vision tower.
        text: the language model's `text_config`, as written (read by mlx-lm).
        scale_factor: the connector's pixel-shuffle factor: each output token gathers a
            `scale_factor` x `scale_factor` block of patches.
        image_token_id: the placeholder token's id.
        tie_word_embeddings: the LM head is the embedding table.
    """

    vision: VisionConfig
    text: dict[str, Any]
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

        Raises:
            ModelLoadError: a required field is missing or the tile does not split into
                whole pixel-shuffle blocks.
        """
        try:
            vision = config["vision_config"]
            vision_config = VisionConfig(
                hidden_size=vision["hidden_size"],
                intermediate_size=vision["intermediate_size"],
                num_layers=vision["num_hidden_layers"],
                num_heads=vision["num_attention_heads"],
                image_size=vision["image_size"],
                patch_size=vision["patch_size"],
                num_channels=vision.get("num_channels", 3),
                layer_norm_eps=vision.get("layer_norm_eps", 1e-6),
                hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"),
            )
            parsed = cls(
                vision=vision_config,
                text=config["text_config"],
                scale_factor=config.get("scale_factor", 2),
                image_token_id=config["image_token_id"],
                tie_word_embeddings=config.get("tie_word_embeddings", False),
            )
        except KeyError as error:
            raise ModelLoadError(f"the Idefics3 config has no {error}") from error
        if vision_config.patches_per_side % parsed.scale_factor:
            raise ModelLoadError(
                f"the Idefics3 tile of {vision_config.patches_per_side} patches a side does "
                f"not split into blocks of scale_factor {parsed.scale_factor}"
            )
        return parsed
