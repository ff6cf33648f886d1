"""Qwen2-VL weight names from the published layouts onto the family's module.

The module's names: `visual.*` (the vision tower and merger), `language_model.model.*` and
`language_model.lm_head.weight` (mlx-lm's qwen2 layout). Folders name them:
- transformers 5: `model.visual.*`, `model.language_model.*`, `lm_head.weight`;
- transformers 4 checkpoints: `visual.*`, `model.*`, `lm_head.weight`;
- mlx-vlm conversions: `vision_tower.*`, `language_model.model.*`,
  `language_model.lm_head.weight`, the patch embedding's Conv3d kernel channels-last.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcel_vision.families.qwen2_vl.config import VisionConfig

# Longest prefix first: `model.visual.` before `model.`.
PREFIXES = (
    ("model.visual.", "visual."),
    ("model.language_model.", "language_model.model."),
    ("vision_tower.", "visual."),
    ("visual.", "visual."),
    ("language_model.", "language_model."),
    ("model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
)
PATCH_EMBED = "visual.patch_embed.proj.weight"
# Buffers some checkpoints save that the model recomputes.
UNUSED_SUFFIXES = ("rotary_emb.inv_freq",)


def module_name(name: str) -> str | None:
    """The module's name for a checkpoint tensor, or None for a recomputed buffer."""
    if name.endswith(UNUSED_SUFFIXES):
        return None
    for prefix, replacement in PREFIXES:
        if name.startswith(prefix):
            return replacement + name[len(prefix) :]
    return name


def patch_embed_matrix(kernel: mx.array, config: VisionConfig) -> mx.array:
    """(width, patch_dim) matrix of the patch embedding's Conv3d kernel.

    The kernel is PyTorch's (width, channels, temporal, patch, patch) or MLX's channels-last
    (width, temporal, patch, patch, channels); the processor flattens patches channels first.
    """
    if kernel.ndim == 2:
        return kernel
    channels_last = (
        config.temporal_patch_size,
        config.patch_size,
        config.patch_size,
        config.in_channels,
    )
    if tuple(kernel.shape[1:]) == channels_last and kernel.shape[1] != config.in_channels:
        kernel = kernel.transpose(0, 4, 1, 2, 3)
    return kernel.reshape(kernel.shape[0], -1)


def map_weights(
    weights: dict[str, mx.array], config: VisionConfig, *, tied_embeddings: bool
) -> dict[str, mx.array]:
    """`weights` under the module's names; a tied model's stored lm_head is dropped."""
    mapped = {}
    for name, value in weights.items():
        target = module_name(name)
        if target is None or (tied_embeddings and target.startswith("language_model.lm_head.")):
            continue
        mapped[target] = patch_embed_matrix(value, config) if target == PATCH_EMBED else value
    return mapped
