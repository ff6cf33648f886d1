"""What Qwen2-VL's vision tower takes for one image."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Qwen2VLImageInputs:
    """One image as the vision tower takes it.

    Attributes:
        pixel_values: (t * h * w, channels * temporal_patch * patch * patch) float32
            normalised patches, grouped by merge_size x merge_size block.
        grid_thw: the patch grid (t, h, w); the image fills t * h * w / merge_size^2
            placeholder tokens.
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
