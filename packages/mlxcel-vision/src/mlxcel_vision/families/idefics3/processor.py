"""Idefics3's image preprocessing and image text, as transformers' `Idefics3Processor`
writes them.

The pixels come from transformers' own numpy/PIL `Idefics3ImageProcessorPil` (no torch):
resize to the longest edge, split into `max_image_size` tiles plus the downscaled global
image when `do_image_splitting`, rescale, normalise. The text is
`Idefics3Processor.replace_image_token`'s: for a split image, each tile as
`<fake_token_around_image><row_r_col_c>` and `image_seq_len` x `<image>`, a newline after
each row, then a newline and the global image as
`<fake_token_around_image><global-img>` + `<image>`s + `<fake_token_around_image>`;
an unsplit image is the global part alone.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from PIL import Image
from transformers.models.idefics3.image_processing_pil_idefics3 import (
    Idefics3ImageProcessorPil,
)

from mlxcel_models.errors import ModelLoadError
from mlxcel_vision.family import ImageRun, PreparedImage

IMAGE_TOKEN = "<image>"
FAKE_TOKEN_AROUND_IMAGE = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"


def image_text(num_rows: int, num_cols: int, image_seq_len: int) -> str:
    """The text an image of `num_rows` x `num_cols` tiles (0 x 0: unsplit) becomes."""
    placeholders = IMAGE_TOKEN * image_seq_len
    global_image = f"{FAKE_TOKEN_AROUND_IMAGE}{GLOBAL_IMAGE_TOKEN}{placeholders}"
    global_image += FAKE_TOKEN_AROUND_IMAGE
    if num_rows == 0 and num_cols == 0:
        return global_image
    rows = (
        "".join(
            f"{FAKE_TOKEN_AROUND_IMAGE}<row_{row}_col_{col}>{placeholders}"
            for col in range(1, num_cols + 1)
        )
        + "\n"
        for row in range(1, num_rows + 1)
    )
    return "".join(rows) + "\n" + global_image


class Idefics3ImageProcessor:
    """The family's `ImageProcessor`: each tile (and the global image) is one `ImageRun`
    whose inputs are its (tile, tile, 3) float32 normalised pixels.

    Args:
        pixels: transformers' processor configured from the folder.
        image_seq_len: placeholder tokens per tile.
        placeholder_token_id: the `<image>` token's id.
    """

    image_marker = IMAGE_TOKEN

    def __init__(
        self, pixels: Idefics3ImageProcessorPil, *, image_seq_len: int, placeholder_token_id: int
    ) -> None:
        self._pixels = pixels
        self.image_seq_len = image_seq_len
        self.placeholder_token_id = placeholder_token_id

    @classmethod
    def from_folder(
        cls, folder: Path, *, tile_size: int, image_seq_len: int, placeholder_token_id: int
    ) -> Idefics3ImageProcessor:
        """Configure from the folder's preprocessor_config.json (or the `image_processor`
        entry of a transformers 5 processor_config.json).

        Args:
            tile_size: the vision tower's `image_size`, pixels; the processor's tiles must
                be exactly that big.

        Raises:
            ModelLoadError: no processor config, or its tiles differ from the tower's.
        """
        try:
            pixels = Idefics3ImageProcessorPil.from_pretrained(str(folder))
        except OSError as error:
            raise ModelLoadError(
                f"{folder}: no Idefics3 image processor config: {error}"
            ) from error
        tile = pixels.max_image_size["longest_edge"]
        if tile != tile_size:
            raise ModelLoadError(
                f"{folder}: the processor's tiles are {tile} pixels but the vision tower "
                f"takes {tile_size}"
            )
        return cls(pixels, image_seq_len=image_seq_len, placeholder_token_id=placeholder_token_id)

    def prepare(self, image: Image.Image) -> PreparedImage:
        """Tile and normalise `image` (any mode; converted to RGB as transformers does) and
        write its text.

        Returns:
            The image text and one run of `image_seq_len` tokens per tile, row by row,
            the global image last.
        """
        encoded = self._pixels.preprocess(image, do_convert_rgb=True, return_row_col_info=True)
        tiles = encoded["pixel_values"][0].transpose(0, 2, 3, 1)
        runs = tuple(ImageRun(self.image_seq_len, mx.array(tile)) for tile in tiles)
        num_rows, num_cols = encoded["rows"][0][0], encoded["cols"][0][0]
        return PreparedImage(image_text(num_rows, num_cols, self.image_seq_len), runs)
