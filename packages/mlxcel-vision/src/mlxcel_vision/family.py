"""What each vision-language family provides: its processor, vision encoder and text decoder.

The generic parts (the `ImageLanguageModel` wrapper, the prompter, the loader) are written
once against these protocols; a family module supplies the three pieces and a `load`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
from PIL import Image

from mlxcel_core.cache import KVCache
from mlxcel_core.images import RowImages


@dataclass(frozen=True)
class ImageRun:
    """One contiguous run of placeholder tokens an image becomes (a tile, or the whole image).

    Attributes:
        num_tokens: placeholder tokens in the run.
        inputs: what the family's `VisionEncoder` takes for this run (pixel values, grid).
    """

    num_tokens: int
    inputs: Any


@dataclass(frozen=True)
class PreparedImage:
    """An image after the family's preprocessing.

    Attributes:
        text: what replaces the image's marker in the rendered prompt: the family's wrapper
            tokens and, for each run in order, `run.num_tokens` placeholder tokens.
        runs: the runs, in prompt order.
    """

    text: str
    runs: tuple[ImageRun, ...]


class ImageProcessor(Protocol):
    """Turns a decoded image into prompt text and encoder inputs, as the family's
    Hugging Face processor does (resize, crop, normalise, patch, tile).

    Attributes:
        image_marker: the text the family's chat template writes for an image part.
        placeholder_token_id: the token id each image position holds in the prompt.
    """

    image_marker: str
    placeholder_token_id: int

    def prepare(self, image: Image.Image) -> PreparedImage:
        """Preprocess one image (any mode; converted to RGB as the family expects)."""
        ...


class VisionEncoder(Protocol):
    """The vision tower and its projector into the text model's embedding space."""

    def __call__(self, inputs: Any) -> mx.array:
        """Encode one run's `ImageRun.inputs`.

        Returns:
            (num_tokens, text_hidden_size) features in the text model's activation dtype.
        """
        ...


class TextDecoder(Protocol):
    """The language model, run on embeddings so that image features can replace
    placeholder embeddings."""

    num_layers: int

    def embed(self, tokens: mx.array) -> mx.array:
        """(B, L) int32 token ids -> (B, L, hidden) embeddings."""
        ...

    def __call__(
        self,
        embeddings: mx.array,
        cache: Sequence[KVCache],
        *,
        images: Sequence[RowImages] | None = None,
        last_only: bool = False,
    ) -> mx.array:
        """Run the decoder on (B, L, hidden) embeddings following what `cache` holds.

        Args:
            images: the rows' images, for families whose positions depend on them
                (multimodal RoPE); others ignore it.

        Returns:
            Logits (B, L, V), or (B, 1, V) with `last_only`.
        """
        ...


@dataclass(frozen=True)
class VisionParts:
    """A loaded vision-language model's pieces.

    Attributes:
        processor: image preprocessing and prompt text.
        encoder: vision tower and projector.
        decoder: the language model.
        module: the module holding every weight of the three (evaluated and counted by the
            loader).
    """

    processor: ImageProcessor
    encoder: VisionEncoder
    decoder: TextDecoder
    module: nn.Module
