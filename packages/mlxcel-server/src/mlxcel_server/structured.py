"""Structured output: `response_format` and tool calls enforced by constrained decoding with
llguidance.

A JSON schema (or, for `json_object`, any JSON object), or a Lark grammar holding schemas
(tool calls, `mlxcel_server.tools.grammar`), is compiled by llguidance into a grammar over
the model's tokenizer; each step's allowed tokens come from its matcher as a
bitmask, which the engine applies to the logits before the sampler chain (see
`mlxcel_core.sampling.TokenConstraint`). JSON is generated compactly (no whitespace between
tokens), so a reply does not drift into blank space. A schema llguidance cannot enforce is a
400, never ignored.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Grammar:
    """A grammar replies must follow.

    Attributes:
        text: the grammar, as llguidance's `grammar_from_*` functions write it.
        param: the request field it came from, named in errors.
    """

    text: str
    param: str


def answer_schema(response_format: ResponseFormat | None) -> dict[str, Any] | None:
    """The JSON schema `response_format` asks for; None for free text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.json_schema is not None:
        return response_format.json_schema.json_schema
    return dict(_JSON_OBJECT)


def response_format_grammar(
    response_format: ResponseFormat | None, param: str = "response_format"
) -> Grammar | None:
    """The grammar `response_format` asks for; None for free text.

    Args:
        param: the request field the format came from (`text.format` for the Responses
            API).

    Raises:
        ApiError: 400 naming `param` when the schema is not a JSON object.
    """
    schema = answer_schema(response_format)
    if schema is None:
        return None
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, _COMPILE_DEFAULTS)
    except ValueError as error:
        raise invalid(f"{param}: {error}", param) from error
    return Grammar(text, param)


def lark_grammar(lark: str, param: str) -> Grammar:
    """A grammar in llguidance's Lark syntax (`%json` rules inline JSON schemas)."""
    return Grammar(llguidance.LLMatcher.grammar_from_lark(lark), param)


def compile_grammar(grammar: Grammar, tokenizer: Tokenizer) -> llguidance.LLMatcher:
    """A matcher of `grammar` over the model's tokenizer.

    Each choice gets its own copy (`LLMatcher.deep_copy`), as matchers hold their position.

    Raises:
        ApiError: 400 naming `grammar.param` when llguidance cannot enforce it (an invalid
            regex `pattern`, an unsupported keyword, ...).
    """
    matcher = llguidance.LLMatcher(_grammar_tokenizer(tokenizer), grammar.text, log_level=0)
    if matcher.is_error():
        raise invalid(
            f"{grammar.param}: the schema cannot be enforced: {matcher.get_error()}",
            grammar.param,
        )
    return matcher
