"""`VisionPrompter`: chat text with image markers to token ids and placeholder runs."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from PIL import Image

from mlxcel_core.images import PromptImage
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_vision.family import ImageProcessor, ImageRun


def image_digest(image: Image.Image) -> str:
    """sha256 hex digest of an image's mode, size and pixel bytes."""
    digest = hashlib.sha256()
    digest.update(image.mode.encode())
    digest.update(f"{image.width}x{image.height}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


class VisionPrompter:
    """The `ImagePrompter` of a vision-language model: its processor and tokenizer.

    Args:
        processor: the family's image processor.
        tokenizer: the model's tokenizer; special tokens written in the text are parsed
            as special tokens.
    """

    def __init__(self, processor: ImageProcessor, tokenizer: Tokenizer) -> None:
        self._processor = processor
        self._tokenizer = tokenizer

    @property
    def image_marker(self) -> str:
        return self._processor.image_marker

    def encode(self, text: str, images: Sequence[object]) -> ImagePrompt:
        """Tokenize `text`, whose i-th `image_marker` stands for `images[i]`.

        Each marker becomes the processor's text for its image; BOS is prepended when the
        model wants it and the text does not begin with it (as `Tokenizer.encode_chat`).
        Each run of placeholder tokens becomes a `PromptImage` whose content hash is the
        image's `image_digest` and the run's index within the image.

        Args:
            text: the rendered prompt, special tokens as text.
            images: `PIL.Image.Image`s, one per marker, in order.

        Raises:
            ValueError: the markers and images do not pair up one to one, or the text
                holds placeholder tokens of its own.
        """
        pieces = text.split(self.image_marker)
        if len(pieces) - 1 != len(images):
            raise ValueError(
                f"the prompt has {len(pieces) - 1} image marker(s) ({self.image_marker!r}) "
                f"but {len(images)} image(s) were given"
            )
        prepared = [self._processor.prepare(image) for image in images]
        expanded = pieces[0] + "".join(
            image.text + piece for image, piece in zip(prepared, pieces[1:], strict=True)
        )
        ids = self._tokenizer.encode(expanded, add_special_tokens=False)
        bos = self._tokenizer.bos_token_id
        if self._tokenizer.add_bos and ids[:1] != [bos]:
            ids = [bos, *ids]
        runs = [
            (f"{image_digest(image)}-{index}", run)
            for image, prepared_image in zip(images, prepared, strict=True)
            for index, run in enumerate(prepared_image.runs)
        ]
        return ImagePrompt(tuple(ids), self._locate(ids, runs))

    def _locate(self, ids: list[int], runs: list[tuple[str, ImageRun]]) -> tuple[PromptImage, ...]:
        """The runs' positions: each, in order, at the next placeholder token."""
        placeholder = self._processor.placeholder_token_id
        expected = sum(run.num_tokens for _, run in runs)
        if ids.count(placeholder) != expected:
            raise ValueError(
                f"the prompt holds {ids.count(placeholder)} image placeholder tokens where "
                f"its images fill {expected}: the text holds placeholder tokens of its own"
            )
        found = []
        position = 0
        for content_hash, run in runs:
            while position < len(ids) and ids[position] != placeholder:
                position += 1
            stop = position + run.num_tokens
            if ids[position:stop] != [placeholder] * run.num_tokens:
                raise ValueError(
                    f"image run {len(found) + 1} should be {run.num_tokens} placeholder "
                    "tokens but the tokenized prompt does not hold them"
                )
            found.append(PromptImage(position, run.num_tokens, content_hash, run.inputs))
            position = stop
        return tuple(found)
