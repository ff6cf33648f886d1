"""How `generate` reads a reply for reasoning: the model's markers, where the reply starts,
the engine constraint of `--reasoning-budget`, and the detokenizer that keeps the markers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.generate import Detokenizer
from mlxcel_core.reasoning import ReasoningMarkers, ReasoningPhase, ReasoningTracker
from mlxcel_core.sampling import TokenConstraint
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_models.tokenizer.reasoning import (
    ReasoningSyntax,
    find_reasoning_syntax,
    opening_phase,
)


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
