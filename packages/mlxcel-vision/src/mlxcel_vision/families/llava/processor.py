"""LLaVA's image preprocessing: transformers' image processor (its PIL backend, which runs
without torch) as the folder's preprocessor_config.json configures it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from transformers import AutoImageProcessor, BaseImageProcessor

from mlxcel_models.errors import ModelLoadError
from mlxcel_vision.family import ImageRun, PreparedImage

PREPROCESSOR_CONFIG = "preprocessor_config.json"


def load_image_processor(folder: Path) -> BaseImageProcessor:
    """The folder's transformers image processor (CLIPImageProcessor for LLaVA 1.5:
    resize the shortest edge, center crop, rescale, normalize), PIL backend.

    Raises:
        ModelLoadError: the folder has no preprocessor_config.json or transformers cannot
            build the processor it names.
    """
    if not (folder / PREPROCESSOR_CONFIG).is_file():
        raise ModelLoadError(f"{folder} has no {PREPROCESSOR_CONFIG}")
    try:
        return AutoImageProcessor.from_pretrained(folder, backend="pil", local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"{folder / PREPROCESSOR_CONFIG}: {error}") from error


class LlavaImageProcessor:
    """An image becomes one run of `num_tokens` image tokens and one normalized picture.

    Args:
        image_processor: transformers' processor producing the vision tower's input size.
        image_token: the image token's text, which LLaVA's chat templates also write for an
            image part.
        image_token_id: its id.
        num_tokens: the tokens an image fills: (image_size / patch_size)^2, plus one for
            the class token when all of the tower's positions are kept.
    """

    def __init__(
        self,
        image_processor: BaseImageProcessor,
        *,
        image_token: str,
        image_token_id: int,
        num_tokens: int,
    ) -> None:
        self._image_processor = image_processor
        self.image_marker = image_token
        self.placeholder_token_id = image_token_id
        self._num_tokens = num_tokens

    def prepare(self, image: Image.Image) -> PreparedImage:
        """Preprocess one image.

        Returns:
            One run whose inputs are (height, width, 3) float32 normalized pixels.
        """
        batch = self._image_processor(images=image.convert("RGB"), return_tensors="np")
        pixels = np.ascontiguousarray(batch["pixel_values"][0].transpose(1, 2, 0), np.float32)
        return PreparedImage(
            self.image_marker * self._num_tokens, (ImageRun(self._num_tokens, pixels),)
        )
