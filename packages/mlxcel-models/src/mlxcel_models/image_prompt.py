"""The seam between chat text with images and a vision-language model's token prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from mlxcel_core.images import PromptImage


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt's token ids with its images' placeholder runs.

    Attributes:
        prompt_ids: the token ids, each image's placeholders included.
        images: the placeholder runs in prompt order (an image split into tiles has one
            run per tile).
    """

    prompt_ids: tuple[int, ...]
    images: tuple[PromptImage, ...]


class ImagePrompter(Protocol):
    """A vision-language model's preprocessing: images and marked text to an `ImagePrompt`.

    Attributes:
        image_marker: the text the model's chat template writes where an image content
            part goes; `encode` expands each one into the image's placeholder tokens.
    """

    image_marker: str

    def encode(self, text: str, images: Sequence[object]) -> ImagePrompt:
        """Tokenize `text`, whose i-th `image_marker` stands for `images[i]`.

        Args:
            text: the rendered prompt (chat template applied), special tokens as text.
            images: decoded `PIL.Image.Image`s, one per marker, in order.

        Raises:
            ValueError: the markers and images do not pair up one to one.
        """
        ...
