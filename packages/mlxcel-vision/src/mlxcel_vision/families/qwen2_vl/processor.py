"""Qwen2-VL's image preprocessing: resize to whole merged patches, normalise, flatten patches."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from mlxcel_models.errors import ModelLoadError
from mlxcel_vision.families.qwen2_vl.image_inputs import Qwen2VLImageInputs
from mlxcel_vision.family import ImageRun, PreparedImage

IMAGE_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
# Keys of preprocessor_config.json naming classes, not settings.
CLASS_KEYS = ("image_processor_type", "processor_class")
# Older checkpoints name the pixel bounds inside `size` as min_pixels / max_pixels.
LEGACY_SIZE_KEYS = {"min_pixels": "shortest_edge", "max_pixels": "longest_edge"}


def _processor_settings(preprocessor_config: dict[str, Any]) -> dict[str, Any]:
    settings = {k: v for k, v in preprocessor_config.items() if k not in CLASS_KEYS}
    if isinstance(settings.get("size"), dict):
        settings["size"] = {
            LEGACY_SIZE_KEYS.get(key, key): value for key, value in settings["size"].items()
        }
    return settings


class Qwen2VLImageProcessor:
    """Preprocessing as transformers' `Qwen2VLImageProcessor` does, by its torch-free PIL
    implementation: `smart_resize` to multiples of patch_size * merge_size within
    [min_pixels, max_pixels], rescale, normalise, repeat the frame into a temporal patch and
    flatten the patches.

    Args:
        preprocessor_config: the folder's preprocessor_config.json.
        placeholder_token_id: the `<|image_pad|>` token's id.

    Raises:
        ModelLoadError: the config's settings are not ones the processor takes, or give no
            pixel bounds.
    """

    image_marker = IMAGE_MARKER

    def __init__(self, preprocessor_config: dict[str, Any], placeholder_token_id: int) -> None:
        try:
            self._processor = Qwen2VLImageProcessorPil(**_processor_settings(preprocessor_config))
        # transformers validates the settings' types and values as it builds the processor.
        except (TypeError, ValueError) as error:
            raise ModelLoadError(f"preprocessor_config.json: {error}") from error
        size = self._processor.size
        if not (size.shortest_edge and size.longest_edge):
            raise ModelLoadError(
                "preprocessor_config.json: the image size needs min_pixels and max_pixels "
                "(shortest_edge and longest_edge)"
            )
        self._merge_size = self._processor.merge_size
        self.placeholder_token_id = placeholder_token_id

    def prepare(self, image: Image.Image) -> PreparedImage:
        """One image as `<|vision_start|>`, t*h*w / merge_size^2 `<|image_pad|>` tokens and
        `<|vision_end|>`, with its patches.

        Raises:
            ValueError: the image's sides differ by a factor over 200 (`smart_resize`).
        """
        features = self._processor(images=image.convert("RGB"), return_tensors="np")
        t, h, w = (int(n) for n in features["image_grid_thw"][0])
        num_tokens = t * h * w // self._merge_size**2
        inputs = Qwen2VLImageInputs(
            pixel_values=np.ascontiguousarray(features["pixel_values"], dtype=np.float32),
            grid_thw=(t, h, w),
        )
        text = "<|vision_start|>" + IMAGE_PAD * num_tokens + "<|vision_end|>"
        return PreparedImage(text=text, runs=(ImageRun(num_tokens, inputs),))
