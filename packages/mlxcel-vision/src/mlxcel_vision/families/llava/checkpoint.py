"""LLaVA weight names in the folders that hold them, mapped onto `LlavaModel`'s.

transformers 5 modules name the parts `model.vision_tower.*`, `model.multi_modal_projector.*`,
`model.language_model.*` and `lm_head`; checkpoints saved by earlier transformers (and by
transformers 5's `save_pretrained`, which writes the earlier names) use `vision_tower.*`
(with or without CLIP's `vision_model.` level), `multi_modal_projector.*`,
`language_model.model.*` and `language_model.lm_head`; mlx-vlm's converted folders use the
earlier names with the patch convolution already channels-last. LLaVA-NeXT adds
`image_newline` (`model.image_newline` in transformers 5).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

_PREFIXES = (
    ("model.image_newline", "image_newline"),
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
    ("model.language_model.", "language_model.model."),
    ("language_model.model.", "language_model.model."),
    ("language_model.lm_head.", "language_model.lm_head."),
    ("lm_head.", "language_model.lm_head."),
)
# Tensors checkpoints carry that LLaVA never reads: CLIP's pooling head and position-id
# buffers older transformers saved.
_UNUSED = ("vision_tower.post_layernorm.",)
_UNUSED_SUFFIXES = (".position_ids",)
_PATCH_EMBEDDING = "vision_tower.embeddings.patch_embedding.weight"
_TEXT_PREFIX = "language_model."


def _renamed(name: str) -> str:
    for old, new in _PREFIXES:
        if name.startswith(old):
            return new + name.removeprefix(old)
    return name


def llava_weights(
    weights: dict[str, mx.array], language_model: nn.Module, num_channels: int
) -> dict[str, mx.array]:
    """`weights` named as `LlavaModel`'s parameters.

    Names of no known layout are kept, for the strict load to report; the text model's
    weights go through its mlx-lm `sanitize` (which drops a tied LM head and precomputed
    RoPE frequencies); the patch convolution is made channels-last
    (out, kernel, kernel, channels) when it comes in PyTorch's (out, channels, kernel,
    kernel).

    Args:
        weights: the folder's tensors by name.
        language_model: the mlx-lm text model the weights are for.
        num_channels: the tower's input channels.
    """
    vision: dict[str, mx.array] = {}
    text: dict[str, mx.array] = {}
    for name, weight in weights.items():
        name = _renamed(name)
        if name.startswith(_UNUSED) or name.endswith(_UNUSED_SUFFIXES):
            continue
        if name.startswith(_TEXT_PREFIX):
            text[name.removeprefix(_TEXT_PREFIX)] = weight
        else:
            vision[name] = weight
    patches = vision.get(_PATCH_EMBEDDING)
    if patches is not None and patches.ndim == 4 and patches.shape[1] == num_channels:
        vision[_PATCH_EMBEDDING] = patches.transpose(0, 2, 3, 1)
    text = language_model.sanitize(text)
    return vision | {_TEXT_PREFIX + name: weight for name, weight in text.items()}
