"""Idefics3 tensor names from Hugging Face and mlx-vlm folders onto mlxcel's modules.

transformers writes `model.vision_model.*`, `model.connector.*`, `model.text_model.*` and
`lm_head.*`, with the patch convolution in PyTorch's (out, in, kh, kw) layout. mlx-vlm's
converted folders drop the `model.` prefix, call the text model `language_model` (its body
under `language_model.model.` or, in older conversions, directly under `language_model.`)
and store the convolution in MLX's (out, kh, kw, in) layout.
"""

from __future__ import annotations

import mlx.core as mx

_PATCH_EMBEDDING = "encoder.vision_model.embeddings.patch_embedding.weight"
# Buffers some exports carry that hold no weights.
_UNUSED_SUFFIXES = ("rotary_emb.inv_freq", "position_ids")
_TEXT_BODY = ("embed_tokens.", "layers.", "norm.")


def _hugging_face_name(name: str) -> str:
    if name.startswith("model.vision_model.") or name.startswith("model.connector."):
        return "encoder." + name.removeprefix("model.")
    if name.startswith("model.text_model."):
        return "text_model.model." + name.removeprefix("model.text_model.")
    if name.startswith("lm_head."):
        return "text_model." + name
    return name


def _mlx_vlm_name(name: str) -> str:
    if name.startswith("vision_model.") or name.startswith("connector."):
        return "encoder." + name
    if name.startswith("language_model.model.") or name.startswith("language_model.lm_head."):
        return "text_model." + name.removeprefix("language_model.")
    body = name.removeprefix("language_model.")
    if body != name and body.startswith(_TEXT_BODY):
        return "text_model.model." + body
    return name


def map_weights(weights: dict[str, mx.array], *, tied: bool) -> dict[str, mx.array]:
    """The folder's tensors under mlxcel's names, the patch convolution in MLX's layout.

    Names neither layout knows are kept as they are, so that the strict load reports them.

    Args:
        weights: tensors as read from the folder's safetensors.
        tied: the LM head is the embedding table; a stored head is then dropped, as
            transformers and mlx-lm ignore it.
    """
    mlx_vlm = any(name.startswith("language_model.") for name in weights)
    rename = _mlx_vlm_name if mlx_vlm else _hugging_face_name
    mapped = {
        rename(name): array
        for name, array in weights.items()
        if not name.endswith(_UNUSED_SUFFIXES)
    }
    if tied:
        mapped.pop("text_model.lm_head.weight", None)
    if not mlx_vlm and _PATCH_EMBEDDING in mapped:
        mapped[_PATCH_EMBEDDING] = mapped[_PATCH_EMBEDDING].transpose(0, 2, 3, 1)
    return mapped
