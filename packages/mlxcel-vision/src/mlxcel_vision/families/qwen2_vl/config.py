"""Qwen2-VL and Qwen2.5-VL settings read from config.json, in any of its published layouts.

Transformers 5 nests the language model's settings under `text_config` and its RoPE under
`rope_parameters`; earlier checkpoints (and mlx-vlm conversions) keep them at the top level
with `rope_scaling: {"type": "mrope", ...}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxcel_models.errors import ModelLoadError

QWEN2_VL = "qwen2_vl"
QWEN2_5_VL = "qwen2_5_vl"
# Qwen2-VL's 2D vision RoPE base; configs written before `rope_parameters` leave it implicit.
DEFAULT_VISION_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's shape.

    Attributes:
        windowed: Qwen2.5-VL's tower (RMSNorm, SwiGLU, window attention) rather than
            Qwen2-VL's (LayerNorm, QuickGELU, full attention).
        width: the blocks' hidden size (`embed_dim` in Qwen2-VL, `hidden_size` in 2.5).
        out_size: the merger's output size, the language model's hidden size.
        window_size: window attention's span in pixels (Qwen2.5-VL).
        full_attention_blocks: the blocks attending over the whole image (Qwen2.5-VL; in
            Qwen2-VL every block does).
    """

    windowed: bool
    depth: int
    width: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    out_size: int
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    merge_size: int
    rope_theta: float
    window_size: int
    full_attention_blocks: frozenset[int]

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: channels x temporal patch x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class Qwen2VLConfig:
    """The family's settings.

    Attributes:
        vision: the vision tower.
        text: the language model's config as mlx-lm's qwen2 `ModelArgs` reads it.
        mrope_section: rotary frequencies given to the temporal, height and width positions.
        rope_theta: the language model's RoPE base.
        image_token_id: the placeholder token each image position holds.
    """

    vision: VisionConfig
    text: dict[str, Any]
    mrope_section: tuple[int, int, int]
    rope_theta: float
    image_token_id: int


def _vision_config(model_type: str, vision: dict[str, Any], text_hidden: int) -> VisionConfig:
    windowed = model_type == QWEN2_5_VL
    width = vision["hidden_size"] if windowed else vision["embed_dim"]
    patch_size = vision["patch_size"]
    return VisionConfig(
        windowed=windowed,
        depth=vision["depth"],
        width=width,
        num_heads=vision["num_heads"],
        intermediate_size=(
            vision["intermediate_size"] if windowed else int(width * vision["mlp_ratio"])
        ),
        hidden_act=vision.get("hidden_act", "silu" if windowed else "quick_gelu"),
        out_size=vision["out_hidden_size"] if windowed else vision.get("hidden_size", text_hidden),
        patch_size=patch_size,
        temporal_patch_size=vision.get("temporal_patch_size", 2),
        in_channels=vision.get("in_channels", vision.get("in_chans", 3)),
        merge_size=vision.get("spatial_merge_size", 2),
        rope_theta=vision.get("rope_parameters", {}).get("rope_theta", DEFAULT_VISION_ROPE_THETA),
        window_size=vision.get("window_size", 0),
        full_attention_blocks=frozenset(
            vision.get("fullatt_block_indexes", []) if windowed else range(vision["depth"])
        ),
    )


def parse_config(config: dict[str, Any]) -> Qwen2VLConfig:
    """Read a Qwen2-VL or Qwen2.5-VL config.json.

    Raises:
        ModelLoadError: the model type is neither family's, or a required field is missing.
    """
    model_type = config.get("model_type")
    if model_type not in (QWEN2_VL, QWEN2_5_VL):
        raise ModelLoadError(f"not a Qwen2-VL config: model_type '{model_type}'")
    text = {**config, **config.get("text_config", {})}
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    try:
        mrope_section = tuple(rope["mrope_section"])
        vision = _vision_config(model_type, config["vision_config"], text["hidden_size"])
        image_token_id = int(config["image_token_id"])
        head_dim = text["hidden_size"] // text["num_attention_heads"]
    except KeyError as error:
        raise ModelLoadError(f"{model_type} config.json lacks {error}") from error
    if len(mrope_section) != 3:
        raise ModelLoadError(f"mrope_section must have 3 entries, got {list(mrope_section)}")
    rope_theta = float(rope.get("rope_theta", text.get("rope_theta", 1_000_000.0)))
    if 2 * sum(mrope_section) != head_dim:
        raise ModelLoadError(
            f"mrope_section {list(mrope_section)} must cover head_dim / 2 = {head_dim // 2}"
        )
    # mlx-lm's qwen2 would build its own 1D RoPE from these; the family replaces it.
    text_args = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_parameters")}
    text_args |= {"model_type": "qwen2", "rope_theta": rope_theta}
    return Qwen2VLConfig(
        vision=vision,
        text=text_args,
        mrope_section=(mrope_section[0], mrope_section[1], mrope_section[2]),
        rope_theta=rope_theta,
        image_token_id=image_token_id,
    )
