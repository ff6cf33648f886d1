"""Structured output: `response_format` enforced by constrained decoding with llguidance.

A JSON schema (or, for `json_object`, any JSON object) is compiled by llguidance into a
grammar over the model's tokenizer; each step's allowed tokens come from its matcher as a
bitmask, which the engine applies to the logits before the sampler chain (see
`mlxcel_core.sampling.TokenConstraint`). JSON is generated compactly (no whitespace between
tokens), so a reply does not drift into blank space. A schema llguidance cannot enforce is a
400, never ignored.
"""

from __future__ import annotations

import functools
from typing import Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np

from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server.errors import invalid
from mlxcel_server.schemas import ResponseFormat

_JSON_OBJECT: dict[str, Any] = {"type": "object"}
_COMPILE_DEFAULTS: llguidance.JsonCompileOptions = {"whitespace_flexible": False}


class GrammarConstraint:
    """A `TokenConstraint` backed by an llguidance matcher; one per request.

    Args:
        matcher: a fresh matcher, not in its error state.
    """

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def allowed_mask(self, vocab_size: int) -> mx.array:
        """(vocab_size,) bool: the tokens the grammar allows next; ids past the tokenizer's
        vocabulary are never allowed."""
        packed = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(packed, bitorder="little")[:vocab_size].astype(np.bool_)
        mask = np.zeros(vocab_size, dtype=np.bool_)
        mask[: bits.shape[0]] = bits
        return mx.array(mask)

    def advance(self, token_id: int) -> None:
        """Raises: ValueError: the grammar does not allow `token_id`."""
        if not self._matcher.consume_token(token_id):
            raise ValueError(f"token {token_id} breaks the grammar: {self._matcher.get_error()}")

    def rollback(self, num_tokens: int) -> None:
        """Raises: ValueError: fewer than `num_tokens` tokens can be undone."""
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise ValueError(f"cannot undo {num_tokens} tokens: {self._matcher.get_error()}")


@functools.lru_cache(maxsize=4)
def _grammar_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    # Building it walks the whole vocabulary (about a second for large ones): once per model.
    return llguidance.hf.from_tokenizer(
        tokenizer.hf_tokenizer,
        n_vocab=tokenizer.vocab_size,
        eos_token=sorted(tokenizer.eos_token_ids),
    )


def make_matcher(
    response_format: ResponseFormat | None,
    tokenizer: Tokenizer,
    *,
    param: str = "response_format",
) -> llguidance.LLMatcher | None:
    """The validated matcher `response_format` asks for; None for free text.

    Each choice gets its own copy (`LLMatcher.deep_copy`), as matchers hold their position.

    Args:
        param: the request field the format came from, named in errors (`text.format` for
            the Responses API).

    Raises:
        ApiError: 400 naming `param` when llguidance cannot enforce the schema (an invalid
            regex `pattern`, an unsupported keyword, ...).
    """
    if response_format is None or response_format.type == "text":
        return None
    schema = _JSON_OBJECT
    if response_format.json_schema is not None:
        schema = response_format.json_schema.json_schema
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, _COMPILE_DEFAULTS)
    except ValueError as error:
        raise invalid(f"{param}: {error}", param) from error
    matcher = llguidance.LLMatcher(_grammar_tokenizer(tokenizer), grammar, log_level=0)
    if matcher.is_error():
        raise invalid(f"{param}: the schema cannot be enforced: {matcher.get_error()}", param)
    return matcher
