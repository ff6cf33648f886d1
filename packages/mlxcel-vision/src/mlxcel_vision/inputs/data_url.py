"""`data:` URLs (RFC 2397) carrying base64 image bytes."""

from __future__ import annotations

import base64
import binascii
import re

from mlxcel_vision.inputs.errors import ImageInputError

_WHITESPACE = re.compile(rb"\s+")


def read_data_url(url: str, *, number: int, max_bytes: int) -> bytes:
    """The bytes a base64 `data:` URL carries (`data:image/png;base64,...`).

    Whitespace inside the payload (MIME line breaks) is ignored.

    Raises:
        ImageInputError: no comma, not base64, corrupt base64, or more than `max_bytes`.
    """
    header, comma, payload = url.partition(",")
    if not comma:
        raise ImageInputError(number, "malformed data URL: no ',' before the data")
    if not header.lower().endswith(";base64"):
        raise ImageInputError(number, "unsupported data URL: the image must be base64 (';base64,')")
    encoded = _WHITESPACE.sub(b"", payload.encode("ascii", errors="replace"))
    # Four base64 characters carry three bytes; refuse before decoding a huge payload.
    if len(encoded) // 4 * 3 > max_bytes + 2:
        raise ImageInputError(number, f"too large: the data URL holds more than {max_bytes} bytes")
    try:
        data = base64.b64decode(encoded, validate=True)
    except binascii.Error as error:
        raise ImageInputError(number, f"corrupt base64 in the data URL: {error}") from error
    if len(data) > max_bytes:
        raise ImageInputError(number, f"too large: {len(data)} bytes, the limit is {max_bytes}")
    if not data:
        raise ImageInputError(number, "the data URL is empty")
    return data
