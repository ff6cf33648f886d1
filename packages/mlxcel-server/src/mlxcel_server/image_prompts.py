"""Chat messages holding images to a vision-language model's prompt.

The server reads no pixels itself: the command line gives it an `ImageDecoder` (mlxcel-vision's
decoding under the operator's media policy) and the model's `ImagePrompter` turns the rendered
conversation and the decoded images into token ids with the images' placeholder runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mlxcel_models.image_prompt import ImagePrompt, ImagePrompter
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.state import ServingModel


class ImageDecoder(Protocol):
    """Reads and decodes an image reference as the operator's media policy allows."""

    def __call__(self, reference: str, *, number: int) -> object:
        """Decode the image `reference` names (data URL, path, `http(s)` URL).

        Args:
            number: the image's 1-based number within its request, named in errors.

        Returns:
            The decoded image (a `PIL.Image.Image`), as the model's `ImagePrompter` takes it.

        Raises:
            ValueError: the image cannot be used; the message, naming image `number` and
                why, is shown to the client.
        """
        ...


@dataclass(frozen=True)
class ImageReference:
    """One image of a request.

    Attributes:
        url: where the image is (data URL, path, URL).
        param: the request field that holds it, named in errors.
    """

    url: str
    param: str


async def decode_images(
    references: Sequence[ImageReference], decoder: ImageDecoder
) -> list[object]:
    """Decode a request's images in order, off the event loop.

    Raises:
        ApiError: 400 naming the first image that cannot be used, and why.
    """
    images = []
    for number, reference in enumerate(references, 1):
        try:
            images.append(await asyncio.to_thread(decoder, reference.url, number=number))
        except ValueError as error:
            raise invalid(str(error), reference.param, code="invalid_image") from error
    return images


def require_prompter(model: ServingModel, param: str) -> ImagePrompter:
    """The served model's image preprocessing.

    Raises:
        ApiError: 400 when the model has no vision support.
    """
    prompter = model.loaded.image_prompter
    if prompter is None:
        raise invalid(
            f"model {model.model_id!r} has no vision support; send text only",
            param,
            code="model_not_vision",
        )
    return prompter


async def encode_image_chat(
    model: ServingModel,
    conversation: Sequence[Mapping[str, Any]],
    references: Sequence[ImageReference],
    decoder: ImageDecoder | None,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    param: str = "messages",
) -> ImagePrompt:
    """The prompt of a conversation whose messages hold `{"type": "image"}` parts, one per
    reference in order: rendered by the chat template (which writes the model's image
    marker for each), then expanded and tokenized by the model's `ImagePrompter`.

    Images are decoded before the model's vision support is checked, so that a bad image
    is reported as such whatever the model.

    Raises:
        ApiError: as `decode_images` and `require_prompter`; 501 when the server reads no
            images (`decoder` is None: mlxcel-vision is not installed) and the model has
            vision support; 400 naming `param` when the template rejects the conversation
            or its markers do not pair up with the images.
    """
    if decoder is None:
        require_prompter(model, references[0].param)
        raise ApiError(
            501,
            "this server cannot read images: install mlxcel with its vision extra "
            "(pip install 'mlxcel[vision]')",
            param=references[0].param,
        )
    images = await decode_images(references, decoder)
    prompter = require_prompter(model, references[0].param)
    tokenizer = model.loaded.tokenizer

    def encode() -> ImagePrompt:
        text = tokenizer.apply_chat_template(
            conversation, tools=tools, template_kwargs=template_kwargs
        )
        return prompter.encode(text, images)

    try:
        return await asyncio.to_thread(encode)
    except ValueError as error:
        raise invalid(str(error), param) from error
