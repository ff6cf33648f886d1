"""OpenAI request fields about OpenAI's hosted service, accepted and without effect here.

Clients and agent frameworks send these on every request; none of them changes the
generated text, so refusing them (as undeclared fields are refused) would break those
clients for nothing. Each is checked for the type OpenAI specifies, so a wrong type is
still a 400 naming it; a value that would ask for something mlxcel does not do (stored
chat completions, another service tier, audio output, truncated input) is a 400 saying so.
Fields that would change the output (`reasoning_effort`, `verbosity`) are not here: they
stay undeclared, and so refused.

The request models take these as mixins, each endpoint the fields OpenAI defines for it:
`EndUserFields` on completions, `ResponsesServiceFields` on the Responses API,
`ChatServiceFields` on chat completions.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

# OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]


def _refused(message: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_value", message)


def _one_tier(tier: str) -> str:
    if tier not in ("auto", "default"):
        raise _refused(
            f"{tier!r} is not offered: mlxcel has one service tier, which 'auto' and 'default' name"
        )
    return tier


def _nothing_stored(store: bool) -> bool:
    if store:
        raise _refused(
            "stored chat completions are not offered: mlxcel keeps no completion for later "
            "retrieval; send store: false or leave it out"
        )
    return store


def _text_only(modalities: list[str]) -> list[str]:
    if modalities != ["text"]:
        raise _refused(
            f"{modalities!r} is not offered: mlxcel generates text only, so modalities "
            "takes ['text']"
        )
    return modalities


def _no_truncation(truncation: str) -> str:
    if truncation == "auto":
        raise _refused(
            "'auto' is not offered: mlxcel drops no input items, and a prompt "
            "longer than the context is a 400; send truncation: 'disabled' or leave it out"
        )
    return truncation


class EndUserFields(BaseModel):
    """`user`: OpenAI's id of the end user, for its abuse monitoring; mlxcel monitors none."""

    model_config = ConfigDict(extra="forbid", strict=True)

    user: str | None = None


class HostedServiceFields(EndUserFields):
    """Fields of chat completions and the Responses API that concern OpenAI's service.

    `safety_identifier` is `user`'s newer name (abuse monitoring); `prompt_cache_key` groups
    requests for OpenAI's prompt cache, while mlxcel's prefix cache matches every request's
    prompt by its tokens, whatever key it names; `metadata` tags a stored object for
    OpenAI's dashboard, and nothing here reads it; `service_tier` picks OpenAI's price and
    latency tier: mlxcel has one, which "auto" and "default" both name, while "flex",
    "scale" and "priority" (slower and cheaper, or faster at a price) would promise
    something it does not do, so they are 400s.
    """

    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    metadata: Metadata | None = None
    service_tier: Annotated[str, AfterValidator(_one_tier)] | None = None


class ResponsesServiceFields(HostedServiceFields):
    """`truncation`: "disabled" (OpenAI's default) makes a prompt too long for the context
    an error, which is what mlxcel does; "auto" would drop input items to fit, which mlxcel
    does not do, so it is a 400. (The Responses API's `store` is implemented: stored
    responses serve `previous_response_id`.)"""

    truncation: Annotated[Literal["auto", "disabled"], AfterValidator(_no_truncation)] | None = None


class ChatServiceFields(HostedServiceFields):
    """`store: true` asks OpenAI to keep the completion for later retrieval, which mlxcel
    does not offer, so only false is taken; `modalities` takes ["text"], the only output
    mlxcel makes (audio output is a 400)."""

    store: Annotated[bool, AfterValidator(_nothing_stored)] | None = None
    modalities: Annotated[list[Literal["text", "audio"]], AfterValidator(_text_only)] | None = None
