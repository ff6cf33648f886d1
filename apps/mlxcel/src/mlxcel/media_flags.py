"""Image inputs on the command line: the server's media policy flags and `generate --image`.

`--allowed-local-media-path` is vLLM's name (llama-server's is the same); fetching `http(s)`
image URLs is off unless `--media-fetch` turns it on, bounded by `--media-max-bytes` and
`--media-fetch-timeout`.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from PIL import Image

from mlxcel.flags import Flag, InputError, UsageError, flag_error
from mlxcel_server.image_prompts import ImageDecoder
from mlxcel_vision.inputs import ImageInputError, MediaPolicy, decode_image, read_image_file
from mlxcel_vision.inputs.policy import DEFAULT_FETCH_TIMEOUT_SECONDS, DEFAULT_MAX_BYTES

MAX_BYTES_FLAG = Flag(
    ("--media-max-bytes",), "media_max_bytes", int, DEFAULT_MAX_BYTES,
    "largest image (bytes) from a data URL, a file or a fetch; larger ones are refused",
    env="MLXCEL_MEDIA_MAX_BYTES",
)  # fmt: skip
MEDIA_FLAGS = (
    Flag(("--allowed-local-media-path",), "allowed_local_media_path", str, None,
         "directory whose files requests may name as images (paths, file:// URLs); "
         "default: none", env="MLXCEL_ALLOWED_LOCAL_MEDIA_PATH"),
    Flag(("--media-fetch",), "media_fetch", bool, False,
         "fetch http(s) image URLs in requests (off by default)", env="MLXCEL_MEDIA_FETCH",
         is_switch=True),
    MAX_BYTES_FLAG,
    Flag(("--media-fetch-timeout",), "media_fetch_timeout", float,
         DEFAULT_FETCH_TIMEOUT_SECONDS,
         "seconds allowed for connecting to an image URL, for each read and for the whole body",
         env="MLXCEL_MEDIA_FETCH_TIMEOUT"),
)  # fmt: skip
IMAGE_FLAGS = (
    Flag(("--image",), "images", str, None,
         "an image file for the prompt (repeatable: the images go, in order, before the "
         "prompt text in the user message); needs a vision-language model", repeatable=True),
    MAX_BYTES_FLAG,
)  # fmt: skip

_FIELD_FLAGS = {"max_bytes": "--media-max-bytes", "fetch_timeout_seconds": "--media-fetch-timeout"}


def _policy(allowed: Path | None, args: argparse.Namespace, **fields: object) -> MediaPolicy:
    try:
        return MediaPolicy(allowed_local_path=allowed, max_bytes=args.media_max_bytes, **fields)
    except ValueError as error:
        raise flag_error(str(error), _FIELD_FLAGS) from error


def image_decoder_from(args: argparse.Namespace) -> ImageDecoder:
    """The server's image decoding under the policy the resolved flags set.

    Raises:
        UsageError: a limit is out of range.
        InputError: `--allowed-local-media-path` is not a directory.
    """
    allowed = None
    if args.allowed_local_media_path is not None:
        allowed = Path(args.allowed_local_media_path).expanduser()
        if not allowed.is_dir():
            raise InputError(
                f"--allowed-local-media-path: not a directory: {args.allowed_local_media_path}"
            )
    policy = _policy(
        allowed,
        args,
        fetch_enabled=args.media_fetch,
        fetch_timeout_seconds=args.media_fetch_timeout,
    )
    return functools.partial(decode_image, policy=policy)


def read_images(args: argparse.Namespace) -> list[Image.Image]:
    """The decoded `--image` files, in order; a file named on the command line needs no
    `--allowed-local-media-path`.

    Raises:
        UsageError: `--media-max-bytes` is out of range.
        InputError: a file cannot be read or is not a usable image (naming it).
    """
    policy = _policy(None, args)
    images = []
    for number, path in enumerate(args.images or (), 1):
        try:
            images.append(read_image_file(Path(path).expanduser(), policy, number=number))
        except ImageInputError as error:
            raise InputError(f"--image {path}: {error.reason}") from error
    return images


def check_image_mode(args: argparse.Namespace) -> None:
    """Raises `UsageError` when `--image` is given where a prompt cannot hold images."""
    if not args.images:
        return
    if args.prompts_file is not None:
        raise UsageError("--image goes with one prompt (-p or -f), not --prompts-file")
    if args.raw:
        raise UsageError("--image needs the chat template to place the images: drop -no-cnv")
