"""Structured output: `response_format`, llama-server's `json_schema` and `grammar`, and tool
calls enforced by constrained decoding with llguidance.

A JSON schema (or, for `json_object`, any JSON object), a GBNF grammar (llama.cpp's syntax,
converted to Lark by llguidance's own converter), or a Lark grammar holding schemas (tool
calls, `mlxcel_server.tools.grammar`), is compiled by llguidance into a grammar over
the model's tokenizer; each step's allowed tokens come from its matcher as a
bitmask, which the engine applies to the logits before the sampler chain (see
`mlxcel_core.sampling.TokenConstraint`). JSON is generated compactly (no whitespace between
tokens), so a reply does not drift into blank space. A schema or grammar llguidance cannot
enforce is a 400 of one line, never ignored.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark

from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server.errors import invalid
from mlxcel_server.schemas import GenerationFields, ResponseFormat

_JSON_OBJECT: dict[str, Any] = {"type": "object"}
_COMPILE_DEFAULTS: llguidance.JsonCompileOptions = {"whitespace_flexible": False}
# llguidance's errors may quote the grammar after the message: numbered lines, a caret.
_LISTING_LINE = re.compile(r"^\s*(\d+ \|.*|\^)\s*$")
_LOCATION = re.compile(r"^at \d+\(\d+\): ")
_REGEX_ERROR = "regex parse error:"


def one_line(error: str) -> str:
    """llguidance's error message as one line: the grammar it quotes and the position in it
    left out, a regular expression's error given with its pattern."""
    lines = [line.strip() for line in error.splitlines() if not _LISTING_LINE.match(line)]
    lines = [line for line in lines if line]
    if not lines:
        return "the grammar is invalid"
    text = _LOCATION.sub("", lines[0])
    if text.endswith(_REGEX_ERROR) and len(lines) >= 3 and lines[-1].startswith("error: "):
        pattern, reason = lines[1], lines[-1].removeprefix("error: ")
        return f"{text.removesuffix(_REGEX_ERROR)}invalid regular expression {pattern!r}: {reason}"
    return " ".join([text, *lines[1:]])


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What keeps llguidance from enforcing a JSON schema, in one line; None when it can."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, _COMPILE_DEFAULTS)
    except ValueError as error:
        return one_line(str(error))
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    return one_line(problem) if problem else None


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
def grammar_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of the model's tokenizer (each token's exact bytes), built once per
    model: building it walks the whole vocabulary (about a second for large ones)."""
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


def answer_constraint(
    fields: GenerationFields, format_param: str = "response_format"
) -> tuple[dict[str, Any] | None, str]:
    """The JSON schema a reply (a non-call answer, with tools) follows, from `json_schema` or
    `response_format`, and the field it came from; None for free text.

    Args:
        format_param: the field `response_format` came from (`text.format` for the
            Responses API).

    Raises:
        ApiError: 400 when more than one of `grammar`, `json_schema` and a JSON
            `response_format` is given (llama-server takes one).
    """
    given = [
        name
        for name, value in (
            ("grammar", fields.grammar),
            ("json_schema", fields.json_schema),
            (format_param, answer_schema(fields.response_format)),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise invalid(
            f"{given[0]} and {given[1]} cannot both be given: each constrains the reply", given[1]
        )
    if fields.json_schema is not None:
        return fields.json_schema, "json_schema"
    return answer_schema(fields.response_format), format_param


def schema_grammar(schema: dict[str, Any], param: str) -> Grammar:
    """The grammar of JSON following `schema`.

    Raises:
        ApiError: 400 naming `param` when the schema is not a JSON object.
    """
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, _COMPILE_DEFAULTS)
    except ValueError as error:
        raise invalid(f"{param}: {one_line(str(error))}", param) from error
    return Grammar(text, param)


def gbnf_grammar(text: str) -> Grammar:
    """llama-server's `grammar`: GBNF (`root ::= ...`), or Lark in llguidance's syntax
    (text with a `start:` rule or `%llguidance`), as llguidance's converter tells them apart.

    Raises:
        ApiError: 400 naming `grammar` when the text is neither.
    """
    try:
        lark = any_to_lark(text)
    # The converter raises plain `Exception` for a missing rule; its message is one line.
    except Exception as error:
        raise invalid(f"grammar: not a GBNF grammar: {error}", "grammar") from error
    return lark_grammar(lark, "grammar")


def request_grammar(
    fields: GenerationFields, format_param: str = "response_format"
) -> Grammar | None:
    """The grammar a request's replies follow, from `grammar`, `json_schema` or
    `response_format`; None for free text.

    Raises:
        ApiError: 400 as `answer_constraint`, `gbnf_grammar` and `schema_grammar`.
    """
    schema, param = answer_constraint(fields, format_param)
    if fields.grammar is not None:
        return gbnf_grammar(fields.grammar)
    return None if schema is None else schema_grammar(schema, param)


def lark_grammar(lark: str, param: str) -> Grammar:
    """A grammar in llguidance's Lark syntax (`%json` rules inline JSON schemas)."""
    return Grammar(llguidance.LLMatcher.grammar_from_lark(lark), param)


def compile_grammar(grammar: Grammar, tokenizer: Tokenizer) -> llguidance.LLMatcher:
    """A matcher of `grammar` over the model's tokenizer.

    Each choice gets its own copy (`LLMatcher.deep_copy`), as matchers hold their position.

    Raises:
        ApiError: 400 naming `grammar.param` when llguidance cannot enforce it (an invalid
            regex `pattern`, an unsupported keyword, an undefined rule, ...), in one line.
    """
    matcher = llguidance.LLMatcher(grammar_tokenizer(tokenizer), grammar.text, log_level=0)
    if matcher.is_error():
        raise invalid(
            f"{grammar.param}: cannot be enforced: {one_line(matcher.get_error())}",
            grammar.param,
        )
    return matcher
