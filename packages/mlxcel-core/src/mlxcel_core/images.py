"""Images inside a token prompt: where they sit and what the model's vision encoder takes.

The engine never looks at pixels. A vision-language model's prompt holds one run of
placeholder tokens per image; `PromptImage` says where that run is and carries the
family's encoder inputs opaquely, and the model replaces the placeholders' embeddings with
the encoder's output while the prompt is prefilled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx

from mlxcel_core.cache import KVCache


@dataclass(frozen=True, eq=False)
class PromptImage:
    """One image's run of placeholder tokens in a prompt.

    Attributes:
        start: index into the prompt's token ids of its first placeholder token.
        num_tokens: placeholder tokens it fills: positions `start` to `start + num_tokens - 1`.
        content_hash: hex digest of the decoded image (and the preprocessing that shaped
            it); equal hashes mean equal encoder outputs. It keys the prefix cache's blocks
            and the model's cache of encoder outputs.
        inputs: the family's vision-encoder inputs (pixel values, patch grid); only the
            model that prepared them reads them.

    Raises:
        ValueError: `start` is negative, `num_tokens` is not positive or the hash is empty.
    """

    start: int
    num_tokens: int
    content_hash: str
    inputs: Any = None

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError(f"an image's start must be >= 0, got {self.start}")
        if self.num_tokens < 1:
            raise ValueError(f"an image must fill at least one token, got {self.num_tokens}")
        if not self.content_hash:
            raise ValueError("an image needs a content hash")

    @property
    def stop(self) -> int:
        """One past its last placeholder position."""
        return self.start + self.num_tokens


def check_prompt_images(images: Sequence[PromptImage], num_prompt_tokens: int) -> None:
    """Check that `images` lie inside the prompt, in order, without overlapping.

    Raises:
        ValueError: an image runs past the prompt's end or overlaps the one before it.
    """
    previous_stop = 0
    for number, image in enumerate(images, 1):
        if image.start < previous_stop:
            raise ValueError(f"image {number} overlaps the image before it or is out of order")
        if image.stop > num_prompt_tokens:
            raise ValueError(
                f"image {number} fills positions {image.start}..{image.stop - 1} of a "
                f"{num_prompt_tokens}-token prompt"
            )
        previous_stop = image.stop


@dataclass(frozen=True)
class RowImages:
    """A batch row's images for one forward pass.

    Attributes:
        offset: positions already in the KV cache before this pass's tokens; the pass's
            tokens sit at positions `offset` on.
        images: all of the row's prompt images (also those outside this pass's tokens:
            models with multimodal RoPE derive every position from them).
    """

    offset: int
    images: tuple[PromptImage, ...]


@runtime_checkable
class ImageLanguageModel(Protocol):
    """A `LanguageModel` whose prompts may hold images.

    It takes a forward pass's per-row images beside the tokens; rows without images (and
    every pass of a text-only request) run exactly as in a text-only model.
    """

    supports_images: bool

    def make_cache(self) -> list[KVCache]:
        """One empty KV cache per attention layer."""
        ...

    def __call__(
        self,
        tokens: mx.array,
        cache: Sequence[KVCache],
        *,
        last_only: bool = False,
        images: Sequence[RowImages] | None = None,
    ) -> mx.array:
        """Run the model on new tokens, extending `cache`.

        Args:
            tokens: (B, L) int32 token ids following what `cache` holds; image positions
                hold the family's placeholder token.
            cache: the per-layer caches, updated in place.
            last_only: compute logits for the last position only.
            images: None, or one `RowImages` per row: the placeholders among this pass's
                positions take the vision encoder's output for them.

        Returns:
            Logits (B, L, V), or (B, 1, V) with `last_only`.
        """
        ...
