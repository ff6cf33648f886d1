"""Log probabilities in the API's shapes: chat's `logprobs.content` and completions' legacy one.

Token text is each token decoded alone, special tokens kept; `bytes` is that text's UTF-8, so a
token holding part of a character shows U+FFFD there (vLLM does the same).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from mlxcel_core.logprobs import TokenLogprobs
from mlxcel_models.tokenizer import Tokenizer


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """A chat choice's (or chunk's) `logprobs`: one entry per generated token."""

    content: list[ChatTokenLogprob]


class CompletionLogprobs(BaseModel):
    """Completions' legacy `logprobs`: parallel lists, one item per generated token.

    `top_logprobs[i]` maps token text to log probability for the requested number of likeliest
    tokens plus the sampled one (so up to `logprobs + 1` keys, as OpenAI documents);
    `text_offset[i]` is the character offset of token i in the choice's text.
    """

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """The text of one token decoded alone, special tokens included."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _top(tokenizer: Tokenizer, token_id: int, logprob: float) -> TopLogprob:
    text = token_text(tokenizer, token_id)
    return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))


def make_chat_logprobs(entries: Sequence[TokenLogprobs], tokenizer: Tokenizer) -> ChatLogprobs:
    """Chat's `logprobs` for the given tokens, in order."""
    content = []
    for entry in entries:
        chosen = _top(tokenizer, entry.token_id, entry.logprob)
        pairs = zip(entry.top_ids, entry.top_logprobs, strict=True)
        tops = [_top(tokenizer, token_id, logprob) for token_id, logprob in pairs]
        content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=tops))
    return ChatLogprobs(content=content)


def make_completion_logprobs(
    entries: Sequence[TokenLogprobs], tokenizer: Tokenizer, offset: int
) -> CompletionLogprobs:
    """Completions' `logprobs` for the given tokens.

    Args:
        entries: the tokens, in order.
        tokenizer: decodes their text.
        offset: character offset of the first token in the choice's text (the echoed
            prompt's length plus the text already sent).
    """
    logprobs = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for entry in entries:
        text = token_text(tokenizer, entry.token_id)
        top: dict[str, float] = {}
        # Most likely first: where two tokens share a text, the likelier one keeps the key.
        for token_id, logprob in zip(entry.top_ids, entry.top_logprobs, strict=True):
            top.setdefault(token_text(tokenizer, token_id), logprob)
        top.setdefault(text, entry.logprob)
        logprobs.tokens.append(text)
        logprobs.token_logprobs.append(entry.logprob)
        logprobs.top_logprobs.append(top)
        logprobs.text_offset.append(offset)
        offset += len(text)
    return logprobs
