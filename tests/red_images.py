"""One 64x64 solid red image in every input form the server takes."""

from __future__ import annotations

import base64
import io

from PIL import Image

SIZE = 64
RED = (255, 0, 0)


def red_image() -> Image.Image:
    return Image.new("RGB", (SIZE, SIZE), RED)


def encode(image: Image.Image, image_format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def red_data_url(image_format: str) -> str:
    """The red image as a base64 data URL in `image_format` (PNG, JPEG, WEBP, GIF)."""
    return data_url(encode(red_image(), image_format), f"image/{image_format.lower()}")
