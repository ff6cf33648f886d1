"""How `generate` and `run` read a reply for reasoning: their reasoning flags, the
template's thinking switch, the model's markers, where the reply starts, the engine
constraint of `--reasoning-budget`, and the detokenizer that keeps the markers."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.common.flags import Flag, UsageError
from mlxcel_core.reasoning import (
    ReasoningMarkers,
    ReasoningPhase,
    ReasoningSplitter,
    ReasoningTracker,
)
from mlxcel_core.request import Detokenizer
from mlxcel_core.sampling import TokenConstraint
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_models.tokenizer.reasoning import (
    ReasoningSyntax,
    find_reasoning_syntax,
    opening_phase,
)

REASONING_FLAGS = (
    Flag(("--show-reasoning",), "show_reasoning", bool, False,
         "print the model's reasoning (dimmed on a terminal) before its answer",
         env="MLXCEL_SHOW_REASONING", is_switch=True),
    Flag(("--reasoning-budget",), "reasoning_budget", int, -1,
         "most reasoning tokens, then the answer; -1 = no limit, 0 = no reasoning",
         env="LLAMA_ARG_THINK_BUDGET"),
)  # fmt: skip


def check_reasoning_budget(args: argparse.Namespace) -> None:
    """Raises `UsageError` when `--reasoning-budget` is below -1."""
    if args.reasoning_budget < -1:
        raise UsageError(f"--reasoning-budget must be -1 or >= 0, got {args.reasoning_budget}")


def thinking_template_kwargs(
    tokenizer: Tokenizer, chat_template: str | None, budget: int
) -> dict[str, bool] | None:
    """The chat template's extra variables for `budget`: `enable_thinking: false` for a
    zero budget when the template has that switch (as llama-server does), else None.

    Args:
        chat_template: the template in use, when not the model's own.
    """
    if budget != 0:
        return None
    syntax = find_reasoning_syntax(tokenizer, chat_template)
    if syntax is None or not syntax.thinking_switch:
        return None
    return {"enable_thinking": False}


@dataclass(frozen=True)
class ReplyReasoning:
    """One prompt's reasoning settings.

    Attributes:
        syntax: the model's reasoning syntax, or None when its template shows none.
        phase: where the reply starts.
        budget: most reasoning tokens, or -1 for no limit.
    """

    syntax: ReasoningSyntax | None
    phase: ReasoningPhase
    budget: int

    @property
    def markers(self) -> ReasoningMarkers | None:
        return None if self.syntax is None else self.syntax.markers

    def make_constraint(self) -> TokenConstraint | None:
        """The budget as an engine constraint, or None without markers or a budget."""
        if self.syntax is None or self.budget < 0 or self.phase is ReasoningPhase.ANSWER:
            return None
        return ReasoningTracker(self.syntax.tokens, phase=self.phase, budget=self.budget)

    def make_detokenizer(self, tokenizer: Tokenizer) -> Detokenizer:
        """A detokenizer that keeps the markers when they are special tokens (gpt-oss's)."""
        keep = self.syntax is not None and self.syntax.markers_are_special
        return tokenizer.make_detokenizer(skip_special_tokens=not keep)

    def make_splitter(self) -> ReasoningSplitter | None:
        """A splitter of the reply's text into reasoning and answer; None without markers."""
        return None if self.syntax is None else ReasoningSplitter(self.syntax.markers, self.phase)


def reply_reasoning(
    tokenizer: Tokenizer, chat_template: str | None, prompt_ids: Sequence[int], budget: int
) -> ReplyReasoning:
    """The reasoning settings of the reply to `prompt_ids`.

    Args:
        chat_template: the template in use, when not the model's own.
        budget: `--reasoning-budget`: -1 for no limit.
    """
    syntax = find_reasoning_syntax(tokenizer, chat_template)
    if syntax is None:
        return ReplyReasoning(None, ReasoningPhase.BEFORE, budget)
    return ReplyReasoning(syntax, opening_phase(tokenizer, prompt_ids, syntax.markers), budget)
