"""Encoded image bytes to one decoded PIL image, with Pillow."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mlxcel_vision.inputs.errors import ImageInputError

SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# Pillow's modes for 16-bit grayscale PNGs; its conversion to RGB clips them at 255 instead
# of scaling, which turns all but the darkest pixels white.
_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I")


def open_image(data: bytes, *, number: int, max_pixels: int) -> Image.Image:
    """Decode `data` (PNG, JPEG, WebP or GIF; a GIF's or animated WebP's first frame).

    The size in the header is checked before any pixel is decoded.

    Args:
        data: the encoded image.
        number: the image's 1-based number within its request, for errors.
        max_pixels: largest width x height accepted.

    Returns:
        The image, fully decoded, in its own mode (callers convert as their model expects),
        except that 16-bit grayscale becomes 8-bit (`L`, the high byte of each pixel);
        turned upright as its EXIF orientation tag says (as viewers show a camera's photo).

    Raises:
        ImageInputError: not an image, an unsupported format, too many pixels, or
            truncated or corrupt image data.
    """
    try:
        image = Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS)
    except UnidentifiedImageError as error:
        raise ImageInputError(number, _unsupported_reason(data)) from error
    except Image.DecompressionBombError as error:
        raise ImageInputError(number, f"too large: {error}") from error
    width, height = image.size
    if width * height > max_pixels:
        raise ImageInputError(
            number, f"too large: {width}x{height} pixels, the limit is {max_pixels} pixels"
        )
    try:
        image.seek(0)
        image.load()
    except (OSError, SyntaxError, ValueError) as error:
        raise ImageInputError(number, f"corrupt {image.format} data: {error}") from error
    # Detached from the file and from any later frames; a copy when no rotation applies.
    upright = ImageOps.exif_transpose(image)
    if upright.mode in _SIXTEEN_BIT_MODES:
        return _eight_bit_gray(upright)
    return upright


def _eight_bit_gray(image: Image.Image) -> Image.Image:
    high_bytes = np.clip(np.asarray(image, dtype=np.int64) >> 8, 0, 255)
    return Image.fromarray(high_bytes.astype(np.uint8))


def _unsupported_reason(data: bytes) -> str:
    supported = ", ".join(SUPPORTED_FORMATS)
    try:
        with Image.open(io.BytesIO(data)) as other:
            return f"unsupported image format {other.format} (supported: {supported})"
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError):
        return f"not an image (supported formats: {supported})"
