"""An image reference, whichever form it takes, to a decoded PIL image."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from mlxcel_vision.inputs.data_url import read_data_url
from mlxcel_vision.inputs.errors import ImageInputError
from mlxcel_vision.inputs.fetch import fetch_url
from mlxcel_vision.inputs.local_files import local_path, read_allowed_file, read_file
from mlxcel_vision.inputs.pixels import open_image
from mlxcel_vision.inputs.policy import MediaPolicy


def decode_image(reference: str, policy: MediaPolicy, *, number: int) -> Image.Image:
    """Read and decode the image `reference` names, as `policy` allows.

    Args:
        reference: a `data:` URL (base64), an `http(s)` URL, a `file://` URL or a path
            (relative ones are taken relative to the allowed directory).
        policy: the operator's media policy.
        number: the image's 1-based number within its request, named in errors.

    Returns:
        The decoded image (a GIF's first frame), in its own mode.

    Raises:
        ImageInputError: the reference cannot be read or decoded; the message says which
            image and why.
    """
    data = _read(reference.strip(), policy, number)
    return open_image(data, number=number, max_pixels=policy.max_pixels)


def read_image_file(path: Path, policy: MediaPolicy, *, number: int) -> Image.Image:
    """Decode an image file the operator named directly (`mlxcel generate --image`): the
    allowed directory does not apply; the byte and pixel limits do.

    Raises:
        ImageInputError: the file cannot be read or decoded.
    """
    data = read_file(path, number=number, max_bytes=policy.max_bytes)
    return open_image(data, number=number, max_pixels=policy.max_pixels)


def _read(reference: str, policy: MediaPolicy, number: int) -> bytes:
    if not reference:
        raise ImageInputError(number, "the image URL is empty")
    scheme = reference.partition(":")[0].lower()
    if scheme == "data":
        return read_data_url(reference, number=number, max_bytes=policy.max_bytes)
    if scheme in ("http", "https"):
        if not policy.fetch_enabled:
            raise ImageInputError(
                number, "fetching http(s) URLs is disabled on this server (--media-fetch)"
            )
        return fetch_url(
            reference,
            number=number,
            max_bytes=policy.max_bytes,
            timeout_seconds=policy.fetch_timeout_seconds,
        )
    if scheme == "file" or "://" not in reference:
        return read_allowed_file(
            local_path(reference),
            policy.allowed_local_path,
            number=number,
            max_bytes=policy.max_bytes,
        )
    raise ImageInputError(
        number, f"unsupported URL scheme {scheme!r} (use data:, http(s): or a path)"
    )
