"""Recognising reasoning markers from chat templates and vocabularies."""

import pytest

from mlxcel_core.reasoning import ReasoningPhase
from mlxcel_models.tokenizer import BUILTIN_CHAT_TEMPLATES
from mlxcel_models.tokenizer.reasoning import (
    CHANNEL_MARKERS,
    THINK_MARKERS,
    find_reasoning_markers,
    find_reasoning_syntax,
    opening_phase,
)

from reasoning_factories import (
    HARMONY_TEMPLATE,
    HARMONY_TOKENS,
    OPEN_THINKING_TEMPLATE,
    THINKING_TEMPLATE,
    make_tokenizer,
)

ASK = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("name", sorted(BUILTIN_CHAT_TEMPLATES))
def test_templates_without_reasoning_have_no_markers(name):
    assert find_reasoning_markers(BUILTIN_CHAT_TEMPLATES[name]) is None


def test_think_and_channel_templates():
    assert find_reasoning_markers(THINKING_TEMPLATE) == THINK_MARKERS
    assert find_reasoning_markers(HARMONY_TEMPLATE) == CHANNEL_MARKERS
    assert find_reasoning_markers(None) is None


def test_think_markers_as_single_text_tokens(tiny_gguf):
    tokenizer = make_tokenizer(tiny_gguf, THINKING_TEMPLATE)
    syntax = find_reasoning_syntax(tokenizer)
    assert syntax.tokens.start_ids == tuple(tokenizer.encode("<think>"))
    assert len(syntax.tokens.start_ids) == len(syntax.tokens.end_ids) == 1
    assert not syntax.markers_are_special and syntax.thinking_switch


def test_channel_markers_are_special_tokens(tiny_gguf):
    tokenizer = make_tokenizer(
        tiny_gguf, HARMONY_TEMPLATE, user_tokens=(), special_tokens=HARMONY_TOKENS
    )
    syntax = find_reasoning_syntax(tokenizer)
    assert syntax.markers == CHANNEL_MARKERS and syntax.markers_are_special
    assert not syntax.thinking_switch
    final = tokenizer.encode("<|channel|>final<|message|>")
    assert syntax.tokens.answer_start_ids == tuple(final)
    assert tokenizer.decode(syntax.tokens.end_ids, skip_special_tokens=False) == "<|end|>"


def test_a_template_given_instead_of_the_models(tiny_gguf):
    tokenizer = make_tokenizer(tiny_gguf, BUILTIN_CHAT_TEMPLATES["chatml"])
    assert find_reasoning_syntax(tokenizer) is None
    assert find_reasoning_syntax(tokenizer, THINKING_TEMPLATE).markers == THINK_MARKERS


def test_where_the_reply_starts(tiny_gguf):
    tokenizer = make_tokenizer(tiny_gguf, THINKING_TEMPLATE)
    opened = tokenizer.encode_chat(ASK)
    closed = tokenizer.encode_chat(ASK, template_kwargs={"enable_thinking": False})
    assert opening_phase(tokenizer, opened, THINK_MARKERS) is ReasoningPhase.REASONING
    assert opening_phase(tokenizer, closed, THINK_MARKERS) is ReasoningPhase.ANSWER
    plain = make_tokenizer(tiny_gguf, OPEN_THINKING_TEMPLATE).encode_chat(ASK)
    assert opening_phase(tokenizer, plain, THINK_MARKERS) is ReasoningPhase.BEFORE
