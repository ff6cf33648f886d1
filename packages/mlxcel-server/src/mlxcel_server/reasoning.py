"""Reasoning in replies: llama-server's `--reasoning-format` and `--reasoning-budget`, per
request, and each choice's split of its text into `reasoning_content` and content.

Stop strings are matched on the whole generated text, reasoning included, as llama-server
matches them (the engine's stop criteria see the raw text); tool calls are read from the
answer only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mlxcel_core.engine import EngineOutput
from mlxcel_core.reasoning import (
    ReasoningDelta,
    ReasoningPhase,
    ReasoningSplitter,
    ReasoningTracker,
)
from mlxcel_core.sampling import TokenConstraint
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_models.tokenizer.reasoning import ReasoningSyntax, opening_phase


class ReasoningFormat(StrEnum):
    """llama-server's reasoning formats.

    `none` leaves the reasoning, markers included, in the content; `deepseek` moves it to
    `reasoning_content`; `deepseek-legacy` fills `reasoning_content` and also leaves the
    raw text in the content; `auto` (the default) is `deepseek` for a model whose template
    shows reasoning markers.
    """

    NONE = "none"
    DEEPSEEK = "deepseek"
    DEEPSEEK_LEGACY = "deepseek-legacy"
    AUTO = "auto"


@dataclass(frozen=True)
class ReasoningPlan:
    """How one request's replies are read for reasoning.

    Attributes:
        syntax: the model's reasoning markers.
        reasoning_format: the request's format, `auto` resolved.
        phase: where each reply starts (see `opening_phase`).
        budget: most reasoning tokens per reply, or None for no limit.
    """

    syntax: ReasoningSyntax
    reasoning_format: ReasoningFormat
    phase: ReasoningPhase
    budget: int | None

    @property
    def splits(self) -> bool:
        """Whether replies are split into reasoning and content (any format but `none`)."""
        return self.reasoning_format is not ReasoningFormat.NONE

    def make_constraint(self, inner: TokenConstraint | None) -> TokenConstraint | None:
        """A choice's engine constraint: the budget, and `inner` (a grammar) held back
        until the answer; `inner` alone when the reply starts in the answer."""
        if self.phase is ReasoningPhase.ANSWER or (self.budget is None and inner is None):
            return inner
        return ReasoningTracker(
            self.syntax.tokens, phase=self.phase, budget=self.budget, inner=inner
        )


def template_kwargs(
    requested: Mapping[str, Any] | None, syntax: ReasoningSyntax | None, budget: int
) -> dict[str, Any]:
    """The chat template's extra variables: a request's `chat_template_kwargs` over the
    server's own, which set `enable_thinking: false` under `--reasoning-budget 0` when the
    template has that switch (as llama-server does)."""
    kwargs: dict[str, Any] = {}
    if budget == 0 and syntax is not None and syntax.thinking_switch:
        kwargs["enable_thinking"] = False
    return {**kwargs, **(requested or {})}


def make_plan(
    syntax: ReasoningSyntax | None,
    reasoning_format: ReasoningFormat,
    budget: int,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int],
) -> ReasoningPlan | None:
    """The reasoning plan of a request, or None when replies are plain text: no markers in
    the template, or format `none` without a budget (a budget holds under `none` too).

    Args:
        budget: -1 for no limit, else the most reasoning tokens per reply.
        prompt_ids: the rendered prompt, whose end tells where replies start.
    """
    if syntax is None or (reasoning_format is ReasoningFormat.NONE and budget < 0):
        return None
    if reasoning_format is ReasoningFormat.AUTO:
        reasoning_format = ReasoningFormat.DEEPSEEK
    return ReasoningPlan(
        syntax=syntax,
        reasoning_format=reasoning_format,
        phase=opening_phase(tokenizer, prompt_ids, syntax.markers),
        budget=None if budget < 0 else budget,
    )


class ReplyReader:
    """Splits one choice's outputs into reasoning and content, and counts its reasoning
    tokens; with no plan, or format `none`, everything is content.

    Args:
        plan: the request's reasoning plan, or None.
    """

    def __init__(self, plan: ReasoningPlan | None) -> None:
        self._tracker = (
            None if plan is None else ReasoningTracker(plan.syntax.tokens, phase=plan.phase)
        )
        self._splitter = (
            ReasoningSplitter(plan.syntax.markers, plan.phase)
            if plan is not None and plan.splits
            else None
        )
        self._legacy = plan is not None and plan.reasoning_format is ReasoningFormat.DEEPSEEK_LEGACY

    @property
    def num_reasoning_tokens(self) -> int:
        return 0 if self._tracker is None else self._tracker.num_reasoning_tokens

    def read(self, output: EngineOutput) -> ReasoningDelta:
        """What `output` adds; on the choice's last output, everything still held back."""
        if self._tracker is not None and output.token_id is not None:
            self._tracker.advance(output.token_id)
        if self._splitter is None:
            return ReasoningDelta(content=output.text)
        delta = self._splitter.feed(output.text)
        if output.finished:
            rest = self._splitter.finish()
            delta = ReasoningDelta(delta.reasoning + rest.reasoning, delta.content + rest.content)
        if self._legacy:
            return ReasoningDelta(delta.reasoning, output.text)
        return delta
