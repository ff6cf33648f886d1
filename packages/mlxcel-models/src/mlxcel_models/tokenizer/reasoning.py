"""Recognising a model's reasoning markers from its chat template and vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.reasoning import ReasoningMarkers, ReasoningPhase, ReasoningTokens
from mlxcel_models.tokenizer.tokenizer import Tokenizer

THINK_MARKERS = ReasoningMarkers("<think>", "</think>")
"""DeepSeek-R1, Qwen3, QwQ and their kin: `<think>…</think>` before the answer."""

CHANNEL_MARKERS = ReasoningMarkers(
    "<|channel|>analysis<|message|>", "<|end|>", "<|channel|>final<|message|>"
)
"""OpenAI's harmony format (gpt-oss): an `analysis` channel message, then the `final` one."""

# Tokens to decode from the prompt's end when looking for an opened span; markers and the
# newlines around them fit with room to spare.
_PROMPT_TAIL_TOKENS = 32


@dataclass(frozen=True)
class ReasoningSyntax:
    """How one model writes reasoning.

    Attributes:
        markers: the marker texts.
        tokens: the marker token ids.
        markers_are_special: the markers are special tokens, which plain detokenization
            leaves out: text to be split must be decoded with special tokens kept.
        thinking_switch: the template reads `enable_thinking` (Qwen3), so passing False
            disables reasoning the template's way.
    """

    markers: ReasoningMarkers
    tokens: ReasoningTokens
    markers_are_special: bool
    thinking_switch: bool


def find_reasoning_markers(template: str | None) -> ReasoningMarkers | None:
    """The reasoning markers a chat template writes, or None when it writes none.

    The template's source is inspected: templates of reasoning models write the markers
    when they render earlier replies or open the reply's span.
    """
    if template is None:
        return None
    if "<|channel|>" in template and "analysis" in template and "final" in template:
        return CHANNEL_MARKERS
    if "<think>" in template and "</think>" in template:
        return THINK_MARKERS
    return None


def find_reasoning_syntax(
    tokenizer: Tokenizer, chat_template: str | None = None
) -> ReasoningSyntax | None:
    """The reasoning syntax of a model, or None when its template shows no reasoning.

    Args:
        tokenizer: the model's tokenizer.
        chat_template: the template in use, when not the model's own.
    """
    template = chat_template if chat_template is not None else tokenizer.chat_template
    markers = find_reasoning_markers(template)
    if markers is None:
        return None

    def ids(text: str | None) -> tuple[int, ...]:
        return () if text is None else tuple(tokenizer.encode(text, add_special_tokens=False))

    tokens = ReasoningTokens(ids(markers.start), ids(markers.end), ids(markers.answer_start))
    return ReasoningSyntax(
        markers=markers,
        tokens=tokens,
        markers_are_special=any(
            tokenizer.decode([i]) == "" for i in (*tokens.start_ids, *tokens.end_ids)
        ),
        thinking_switch=template is not None and "enable_thinking" in template,
    )


def opening_phase(
    tokenizer: Tokenizer, prompt_ids: Sequence[int], markers: ReasoningMarkers
) -> ReasoningPhase:
    """Where the reply to `prompt_ids` starts.

    `REASONING` when the prompt ends with an opened span (Qwen3-thinking and DeepSeek-R1
    templates add `<think>` to the generation prompt), `ANSWER` when it ends with a closed
    one (thinking disabled through the template) or opens the answer, else `BEFORE`.
    """
    tail = tokenizer.decode(prompt_ids[-_PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    tail = tail.rstrip()
    if tail.endswith(markers.start):
        return ReasoningPhase.REASONING
    if markers.answer_start is not None and tail.endswith(markers.answer_start):
        return ReasoningPhase.ANSWER
    if markers.answer_start is None and tail.endswith(markers.end):
        return ReasoningPhase.ANSWER
    return ReasoningPhase.BEFORE
