"""Image inputs on the command line: the server's media policy flags and `generate --image`.

`--allowed-local-media-path` is vLLM's name (llama-server's is the same); fetching `http(s)`
image URLs is off unless `--media-fetch` turns it on, bounded by `--media-max-bytes` and
`--media-fetch-timeout`. Images need the vision extra (mlxcel-vision): without it the server
reads no images (a request with one gets the 400 of a model without vision support), and
any of these flags is a usage error naming the extra; the limits' defaults are mlxcel-vision's.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from mlxcel.common.flags import Flag, UsageError, flag_error, import_extra
from mlxcel_core.errors import InputError
from mlxcel_server.image_prompts import ImageDecoder

if TYPE_CHECKING:
    from PIL import Image

    from mlxcel_vision.inputs import MediaPolicy

MAX_BYTES_FLAG = Flag(
    ("--media-max-bytes",), "media_max_bytes", int, None,
    "largest image (bytes) from a data URL, a file or a fetch; larger ones are refused "
    "(default: 20 MiB)",
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
    Flag(("--media-fetch-timeout",), "media_fetch_timeout", float, None,
         "seconds allowed for connecting to an image URL, for each read and for the whole body "
         "(default: 10)",
         env="MLXCEL_MEDIA_FETCH_TIMEOUT"),
)  # fmt: skip
IMAGE_FLAGS = (
    Flag(("--image",), "images", str, None,
         "an image file for the prompt (repeatable: the images go, in order, before the "
         "prompt text in the user message); needs a vision-language model", repeatable=True),
    MAX_BYTES_FLAG,
)  # fmt: skip

_FIELD_FLAGS = {"max_bytes": "--media-max-bytes", "fetch_timeout_seconds": "--media-fetch-timeout"}


def _vision_inputs(args: argparse.Namespace, flags: Sequence[Flag]) -> ModuleType | None:
    """`mlxcel_vision.inputs`, or None without the vision extra.

    Raises:
        UsageError: one of `flags` is given (on the command line or in the environment)
            without the extra.
    """
    given = [flag.names[-1] for flag in flags if getattr(args, flag.dest) != flag.default]
    if given:
        return import_extra("mlxcel_vision.inputs", extra="vision", needed_by=given[0])
    try:
        import mlxcel_vision.inputs as inputs
    except ImportError:
        return None
    return inputs


def _policy(
    inputs: ModuleType, allowed: Path | None, args: argparse.Namespace, **fields: object
) -> MediaPolicy:
    """A `MediaPolicy` of the flags given; those not given keep mlxcel-vision's defaults."""
    given = {"max_bytes": args.media_max_bytes, **fields}
    try:
        return inputs.MediaPolicy(
            allowed_local_path=allowed, **{k: v for k, v in given.items() if v is not None}
        )
    except ValueError as error:
        raise flag_error(str(error), _FIELD_FLAGS) from error


def image_decoder_from(args: argparse.Namespace) -> ImageDecoder | None:
    """The server's image decoding under the policy the resolved flags set; None without
    the vision extra.

    Raises:
        UsageError: a limit is out of range, or a media flag is given without the extra.
        InputError: `--allowed-local-media-path` is not a directory.
    """
    inputs = _vision_inputs(args, MEDIA_FLAGS)
    if inputs is None:
        return None
    allowed = None
    if args.allowed_local_media_path is not None:
        allowed = Path(args.allowed_local_media_path).expanduser()
        if not allowed.is_dir():
            raise InputError(
                f"--allowed-local-media-path: not a directory: {args.allowed_local_media_path}"
            )
    policy = _policy(
        inputs,
        allowed,
        args,
        fetch_enabled=args.media_fetch,
        fetch_timeout_seconds=args.media_fetch_timeout,
    )
    return functools.partial(inputs.decode_image, policy=policy)


def read_images(args: argparse.Namespace) -> list[Image.Image]:
    """The decoded `--image` files, in order; a file named on the command line needs no
    `--allowed-local-media-path`.

    Raises:
        UsageError: `--media-max-bytes` is out of range, or an image flag is given without
            the vision extra.
        InputError: a file cannot be read or is not a usable image (naming it).
    """
    inputs = _vision_inputs(args, IMAGE_FLAGS)
    if inputs is None:
        return []
    policy = _policy(inputs, None, args)
    images = []
    for number, path in enumerate(args.images or (), 1):
        try:
            images.append(inputs.read_image_file(Path(path).expanduser(), policy, number=number))
        except inputs.ImageInputError as error:
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
