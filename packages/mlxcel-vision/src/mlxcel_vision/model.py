"""`VisionLanguageModel`: a family's encoder and decoder behind `ImageLanguageModel`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_core.images import PromptImage, RowImages
from mlxcel_vision.family import VisionParts

DEFAULT_CACHED_IMAGES = 8


class VisionLanguageModel:
    """A vision-language model over mlxcel KV caches.

    Each pass embeds its tokens with the text model's embedding table, writes the vision
    encoder's output over the placeholder positions of the images it covers, and runs the
    text decoder on the result. An image's encoder output is kept in a small LRU keyed by
    its content hash, so a prompt prefilled in chunks, or a second request about the same
    image, encodes it once. A pass whose rows cover no image position never runs the
    encoder.

    Args:
        parts: the family's processor, encoder, decoder and the module holding their
            weights.
        max_cached_images: encoder outputs kept (each is (num_tokens, hidden)).

    Raises:
        ValueError: `max_cached_images` is below 1.
    """

    supports_images = True

    def __init__(self, parts: VisionParts, *, max_cached_images: int = DEFAULT_CACHED_IMAGES):
        if max_cached_images < 1:
            raise ValueError(f"max_cached_images must be >= 1, got {max_cached_images}")
        self.parts = parts
        self._max_cached_images = max_cached_images
        self._features: OrderedDict[str, mx.array] = OrderedDict()

    @property
    def module(self) -> nn.Module:
        """The module holding every weight (vision tower, projector, text model)."""
        return self.parts.module

    @property
    def num_layers(self) -> int:
        """Decoder layers, each with one KV cache."""
        return self.parts.decoder.num_layers

    def make_cache(self) -> list[KVCache]:
        return [DenseKVCache() for _ in range(self.num_layers)]

    def __call__(
        self,
        tokens: mx.array,
        cache: Sequence[KVCache],
        *,
        last_only: bool = False,
        images: Sequence[RowImages] | None = None,
    ) -> mx.array:
        """Run the model on (B, L) int32 `tokens` (see `ImageLanguageModel.__call__`).

        Raises:
            ValueError: `images` does not give one entry per row, or the encoder's output
                for an image does not have the image's number of tokens.
        """
        embeddings = self.parts.decoder.embed(tokens)
        if images is not None:
            if len(images) != tokens.shape[0]:
                raise ValueError(
                    f"images must give one RowImages per row: {tokens.shape[0]} rows, "
                    f"{len(images)} given"
                )
            embeddings = self._write_images(embeddings, images)
        return self.parts.decoder(embeddings, cache, images=images, last_only=last_only)

    def _write_images(self, embeddings: mx.array, rows: Sequence[RowImages]) -> mx.array:
        """`embeddings` (B, L, hidden) with each image's features over the placeholder
        positions this pass covers: pass position p holds prompt position offset + p."""
        length = embeddings.shape[1]
        for row, row_images in enumerate(rows):
            first, stop = row_images.offset, row_images.offset + length
            for image in row_images.images:
                start, end = max(image.start, first), min(image.stop, stop)
                if start >= end:
                    continue
                features = self._encoded(image)[start - image.start : end - image.start]
                embeddings[row, start - first : end - first] = features.astype(embeddings.dtype)
        return embeddings

    def _encoded(self, image: PromptImage) -> mx.array:
        features = self._features.get(image.content_hash)
        if features is not None:
            self._features.move_to_end(image.content_hash)
            return features
        features = self.parts.encoder(image.inputs)
        if features.shape[0] != image.num_tokens:
            raise ValueError(
                f"the vision encoder gave {features.shape[0]} features for an image of "
                f"{image.num_tokens} tokens"
            )
        self._features[image.content_hash] = features
        if len(self._features) > self._max_cached_images:
            self._features.popitem(last=False)
        return features
