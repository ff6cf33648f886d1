"""llama-server's own completion API (`POST /completion`): its request body and its reply
fields, as llama-server's server README documents them.

The request takes the generation fields the OpenAI endpoints take (`n_predict`, `stop`,
the samplers, `grammar`, `json_schema`, `n_probs`, `cache_prompt`, ...) and one prompt:
text, token ids, or a list mixing both. The reply is one object (`content`, `stop`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `stop_type`, `stopping_word`,
`timings`, ...), or, streamed, one such object per piece of text, the last one with
`stop: true` and the totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from mlxcel_core.logprobs import TokenLogprobs
from mlxcel_core.request import FinishReason, GenerationStats
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server.errors import invalid
from mlxcel_server.logprobs import token_text
from mlxcel_server.responses import Timings, make_timings
from mlxcel_server.schemas import GenerationFields
from mlxcel_server.stop_strings import StopStringTracker

StopType = Literal["none", "eos", "limit", "word"]


class NativeCompletionRequest(GenerationFields):
    """A `/completion` body: `prompt` is text, token ids, or a list of token ids and texts
    (one prompt; a list of texts alone would be several prompts, which `/completion` here
    does not take: `/v1/completions` does). `return_tokens` adds the generated token ids.
    `n_probs` reports that many likeliest tokens per generated token."""

    prompt: str | list[int | str]
    return_tokens: bool = False


def check_native_fields(body: NativeCompletionRequest) -> None:
    """Raises: ApiError: 400 for the OpenAI fields `/completion` has no place for (`n`
    other than 1, `stream_options`), or for several prompts."""
    if body.n != 1:
        raise invalid(f"n: /completion generates one completion, got n={body.n}", "n")
    if body.stream_options is not None:
        raise invalid("stream_options: /completion streams no usage chunk", "stream_options")
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise invalid(
            "prompt: a list of texts is several prompts; /completion takes one "
            "(send several to /v1/completions)",
            "prompt",
        )


def prompt_ids(prompt: str | list[int | str], tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids: text encoded (the model's BOS added where it adds one, before
    the first piece only), token ids kept.

    Raises:
        ApiError: 400 for an empty list or a token id outside the vocabulary.
    """
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if not prompt:
        raise invalid("prompt must be text, token ids, or a list of both; got []", "prompt")
    ids: list[int] = []
    for position, piece in enumerate(prompt):
        if isinstance(piece, str):
            ids += tokenizer.encode(piece, add_special_tokens=position == 0)
        elif not 0 <= piece < tokenizer.vocab_size:
            raise invalid(
                f"prompt[{position}]: token id {piece} is outside the vocabulary "
                f"[0, {tokenizer.vocab_size})",
                f"prompt[{position}]",
            )
        else:
            ids.append(piece)
    return ids


def num_probs(body: NativeCompletionRequest) -> int | None:
    """The likeliest tokens reported per token (`n_probs`); None for none.

    Raises:
        ApiError: 400 naming `n_probs` when negative.
    """
    if body.n_probs is None or body.n_probs == 0:
        return None
    if body.n_probs < 0:
        raise invalid(f"n_probs must be >= 0, got {body.n_probs}", "n_probs")
    return body.n_probs


class TokenProb(BaseModel):
    id: int
    token: str
    logprob: float
    bytes: list[int]


class TokenProbs(TokenProb):
    """One generated token's entry of `completion_probabilities`."""

    top_logprobs: list[TokenProb]


def _prob(tokenizer: Tokenizer, token_id: int, logprob: float) -> TokenProb:
    text = token_text(tokenizer, token_id)
    return TokenProb(id=token_id, token=text, logprob=logprob, bytes=list(text.encode("utf-8")))


def make_probs(entries: Sequence[TokenLogprobs], tokenizer: Tokenizer) -> list[TokenProbs]:
    """`completion_probabilities` for the given tokens, in order."""
    probs = []
    for entry in entries:
        chosen = _prob(tokenizer, entry.token_id, entry.logprob)
        pairs = zip(entry.top_ids, entry.top_logprobs, strict=True)
        tops = [_prob(tokenizer, token_id, logprob) for token_id, logprob in pairs]
        probs.append(TokenProbs(**chosen.model_dump(), top_logprobs=tops))
    return probs


class NativeCompletion(BaseModel):
    """A `/completion` reply, or one streamed piece of it (`stop: false`, the totals
    left out).

    `content` is the text (a streamed piece's new text); `tokens` the generated ids (with
    `return_tokens`, or streamed); `stop_type` is `eos` (an end token), `limit` (the token
    limit or the context), `word` (a stop string, given as `stopping_word`), or `none`
    while generating.
    """

    index: int = 0
    content: str
    tokens: list[int]
    id_slot: int = -1
    stop: bool
    model: str | None = None
    tokens_predicted: int
    tokens_evaluated: int
    prompt: str | None = None
    has_new_line: bool | None = None
    stop_type: StopType | None = None
    stopping_word: str | None = None
    tokens_cached: int | None = None
    timings: Timings | None = None
    completion_probabilities: list[TokenProbs] | None = None


def stop_type(finish_reason: FinishReason, stopping_word: str | None) -> StopType:
    """llama-server's `stop_type` of a finished reply."""
    if finish_reason is FinishReason.LENGTH:
        return "limit"
    return "word" if stopping_word is not None else "eos"


def final_fields(
    stats: GenerationStats, finish_reason: FinishReason, tracker: StopStringTracker
) -> dict:
    """The fields only the last (or only) reply object carries.

    Args:
        stats: the reply's timings.
        finish_reason: why it ended.
        tracker: has followed the reply's tokens (it tells the stop string met).
    """
    stopping_word = tracker.stop_string_met() if finish_reason is FinishReason.STOP else None
    return {
        "stop": True,
        "stop_type": stop_type(finish_reason, stopping_word),
        "stopping_word": stopping_word or "",
        "tokens_predicted": stats.generated_tokens,
        "tokens_cached": stats.cached_tokens,
        "timings": make_timings([stats]),
    }
