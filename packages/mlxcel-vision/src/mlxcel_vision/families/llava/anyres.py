"""LLaVA-NeXT's "anyres" images (`llava_next`): an image is resized and padded to the best of
the config's grid resolutions and cut into tower-sized tiles; the tiles' features are laid
back out as one feature map, the padding removed, a learned newline embedding closes each
row, and the features of a downscaled whole image come first.

Reference: Liu et al. 2024, "LLaVA-NeXT: Improved reasoning, OCR, and world knowledge";
transformers' `LlavaNextModel.pack_image_features` and `LlavaNextProcessor`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from PIL import Image
from transformers import BaseImageProcessor
from transformers.image_processing_utils import select_best_resolution

from mlxcel_vision.families.llava.model import LlavaArgs, LlavaModel, select_features
from mlxcel_vision.family import ImageRun, PreparedImage


@dataclass(frozen=True)
class AnyresImage:
    """One image's encoder inputs.

    Attributes:
        tiles: (num_tiles, image_size, image_size, 3) float32 normalized pixels; the first
            is the whole image, the rest the grid row by row.
        height: the image's height before preprocessing (pixels).
        width: its width.
    """

    tiles: np.ndarray
    height: int
    width: int


def _unpadded_grid(
    height: int, width: int, grid_pinpoints: tuple[tuple[int, int], ...], args: LlavaArgs
) -> tuple[int, int, int, int]:
    """(rows, columns) of tiles, then (rows, columns) of feature positions left once the
    padding the image got is removed."""
    best_height, best_width = select_best_resolution((height, width), list(grid_pinpoints))
    tile_rows, tile_columns = (
        best_height // args.vision.image_size,
        best_width // args.vision.image_size,
    )
    side = args.vision.image_size // args.vision.patch_size
    rows, columns = tile_rows * side, tile_columns * side
    if width / height > columns / rows:
        kept = int(round(height * (columns / width), 7))
        rows -= (rows - kept) // 2 * 2
    else:
        kept = int(round(width * (rows / height), 7))
        columns -= (columns - kept) // 2 * 2
    return tile_rows, tile_columns, rows, columns


class AnyresImageProcessor:
    """LLaVA-NeXT's `ImageProcessor`: transformers' tiling, one run of image tokens per image
    (the whole image's features, then the unpadded grid with a newline per row)."""

    def __init__(
        self,
        image_processor: BaseImageProcessor,
        args: LlavaArgs,
        grid_pinpoints: tuple[tuple[int, int], ...],
        *,
        image_token: str,
    ) -> None:
        self._image_processor = image_processor
        self._args = args
        self._grid_pinpoints = grid_pinpoints
        self.image_marker = image_token
        self.placeholder_token_id = args.image_token_id

    def prepare(self, image: Image.Image) -> PreparedImage:
        batch = self._image_processor(images=image.convert("RGB"), return_tensors="np")
        height, width = (int(size) for size in batch["image_sizes"][0])
        tiles = np.ascontiguousarray(batch["pixel_values"][0].transpose(0, 2, 3, 1), np.float32)
        _, _, rows, columns = _unpadded_grid(height, width, self._grid_pinpoints, self._args)
        num_tokens = self._args.num_image_tokens + rows * (columns + 1)
        return PreparedImage(
            self.image_marker * num_tokens,
            (ImageRun(num_tokens, AnyresImage(tiles, height, width)),),
        )


class AnyresImageEncoder:
    """LLaVA-NeXT's `VisionEncoder`: tower and projector on every tile, then the feature map
    laid out, unpadded and given its row newlines."""

    def __init__(
        self, model: LlavaModel, args: LlavaArgs, grid_pinpoints: tuple[tuple[int, int], ...]
    ) -> None:
        self._model = model
        self._args = args
        self._grid_pinpoints = grid_pinpoints

    def __call__(self, inputs: AnyresImage) -> mx.array:
        """Returns (num_tokens, text_hidden_size) features: the whole image's, then the grid's
        rows, each followed by the newline embedding."""
        features = select_features(self._model, self._args, inputs.tiles)
        tile_rows, tile_columns, rows, columns = _unpadded_grid(
            inputs.height, inputs.width, self._grid_pinpoints, self._args
        )
        side = self._args.vision.image_size // self._args.vision.patch_size
        D = features.shape[-1]
        grid = features[1:].reshape(tile_rows, tile_columns, side, side, D)
        grid = grid.transpose(0, 2, 1, 3, 4).reshape(tile_rows * side, tile_columns * side, D)
        top, left = (grid.shape[0] - rows) // 2, (grid.shape[1] - columns) // 2
        grid = grid[top : top + rows, left : left + columns]
        newline = mx.broadcast_to(self._model.image_newline.astype(grid.dtype), (rows, 1, D))
        grid = mx.concatenate([grid, newline], axis=1).reshape(rows * (columns + 1), D)
        return mx.concatenate([features[0], grid], axis=0)
