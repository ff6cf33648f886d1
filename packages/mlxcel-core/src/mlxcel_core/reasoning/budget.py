"""Following a reply's reasoning span token by token: counting it, bounding it (a reasoning
budget), and holding a structured-output constraint back until the answer starts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.reasoning.splitter import ReasoningPhase
from mlxcel_core.sampling.constraint import TokenConstraint


@dataclass(frozen=True)
class ReasoningTokens:
    """The token ids of a model's reasoning markers.

    Attributes:
        start_ids: the tokens that open the span (often one special token).
        end_ids: the tokens that close it; a spent budget forces them.
        reopens: whether a closed span may be followed by another (channel-style formats,
            where framing sits between the reasoning and the answer).

    Raises:
        ValueError: a marker has no tokens.
    """

    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    reopens: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "start_ids", tuple(self.start_ids))
        object.__setattr__(self, "end_ids", tuple(self.end_ids))
        if not self.start_ids or not self.end_ids:
            raise ValueError(f"reasoning markers must have tokens, got {self!r}")


@dataclass(frozen=True)
class _State:
    phase: ReasoningPhase
    num_tokens: int  # tokens seen inside the span, the end marker's matched part included
    progress: int  # leading tokens of the awaited marker matched so far
    fed_inner: bool  # whether the step that led here advanced the inner constraint


class ReasoningTracker:
    """A `TokenConstraint` that follows the reasoning span and enforces a budget.

    Inside the span every token is allowed until `budget` reasoning tokens have been drawn;
    then only the end marker's tokens are, one by one, and the answer continues after them
    (as llama.cpp's reasoning budget does). An `inner` constraint (a grammar) applies to
    the answer only; before a span opens, it applies together with the start marker, so
    the model may still open one (once it starts to, it must finish the marker).

    Without a budget or inner constraint it allows everything and only counts, so the same
    class measures `reasoning_tokens` from a stream of token ids.

    Args:
        tokens: the marker token ids.
        phase: where the reply starts (`REASONING` when the prompt opened the span,
            `ANSWER` when it closed it).
        budget: most reasoning tokens, or None for no limit.
        inner: the answer's constraint, or None.

    Raises:
        ValueError: `budget` is negative.
    """

    def __init__(
        self,
        tokens: ReasoningTokens,
        *,
        phase: ReasoningPhase = ReasoningPhase.BEFORE,
        budget: int | None = None,
        inner: TokenConstraint | None = None,
    ) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"budget must be >= 0 or None, got {budget}")
        self._tokens = tokens
        self._budget = budget
        self._inner = inner
        self._state = _State(phase, 0, 0, False)
        self._history: list[_State] = []

    @property
    def phase(self) -> ReasoningPhase:
        return self._state.phase

    @property
    def num_reasoning_tokens(self) -> int:
        """Tokens drawn inside the span so far, markers excluded."""
        state = self._state
        in_end_marker = state.progress if state.phase is ReasoningPhase.REASONING else 0
        return state.num_tokens - in_end_marker

    def _awaited(self) -> Sequence[int]:
        if self._state.phase is ReasoningPhase.REASONING:
            return self._tokens.end_ids
        return self._tokens.start_ids

    def allowed_mask(self, vocab_size: int) -> mx.array:
        """(V,) bool: the tokens allowed next (see the class)."""
        state = self._state
        if state.phase is ReasoningPhase.ANSWER:
            if self._inner is not None:
                return self._inner.allowed_mask(vocab_size)
            return mx.ones((vocab_size,), dtype=mx.bool_)
        if state.phase is ReasoningPhase.REASONING:
            if self._budget is not None and self.num_reasoning_tokens >= self._budget:
                return _only(self._tokens.end_ids[state.progress], vocab_size)
            return mx.ones((vocab_size,), dtype=mx.bool_)
        if self._inner is None or state.phase is ReasoningPhase.BETWEEN:
            return mx.ones((vocab_size,), dtype=mx.bool_)
        if state.progress > 0:
            return _only(self._tokens.start_ids[state.progress], vocab_size)
        return self._inner.allowed_mask(vocab_size) | _only(self._tokens.start_ids[0], vocab_size)

    def advance(self, token_id: int) -> None:
        """Record the token drawn.

        Raises:
            ValueError: the budget or the inner constraint does not allow `token_id`.
        """
        state = self._state
        awaited = self._awaited()
        progress = _match(awaited, state.progress, token_id)
        if state.phase is ReasoningPhase.REASONING:
            forced = self._budget is not None and self.num_reasoning_tokens >= self._budget
            if forced and progress != state.progress + 1:
                raise ValueError(f"the reasoning budget is spent; token {token_id} cannot follow")
            new = _State(state.phase, state.num_tokens + 1, progress, False)
            if progress == len(awaited):
                after = ReasoningPhase.BETWEEN if self._tokens.reopens else ReasoningPhase.ANSWER
                new = _State(after, state.num_tokens + 1 - progress, 0, False)
        elif state.phase is ReasoningPhase.ANSWER:
            if self._inner is not None:
                self._inner.advance(token_id)
            new = _State(state.phase, state.num_tokens, 0, self._inner is not None)
        elif progress == len(awaited):
            new = _State(ReasoningPhase.REASONING, state.num_tokens, 0, False)
        elif progress > 0 or self._inner is None or state.phase is ReasoningPhase.BETWEEN:
            new = _State(state.phase, state.num_tokens, progress, False)
        else:
            # Answer text before any span: the answer has begun, under its constraint.
            self._inner.advance(token_id)
            new = _State(ReasoningPhase.ANSWER, state.num_tokens, 0, True)
        self._history.append(state)
        self._state = new

    def rollback(self, num_tokens: int) -> None:
        """Undo the latest `num_tokens` advances (speculative decoding's verification).

        Raises:
            ValueError: fewer than `num_tokens` advances can be undone.
        """
        if not 0 <= num_tokens <= len(self._history):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens; {len(self._history)} were advanced"
            )
        if num_tokens == 0:
            return
        undone = [self._state, *self._history[len(self._history) - num_tokens + 1 :]]
        num_inner = sum(state.fed_inner for state in undone)
        if num_inner and self._inner is not None:
            self._inner.rollback(num_inner)
        self._state = self._history[-num_tokens]
        del self._history[-num_tokens:]


def _match(marker: Sequence[int], progress: int, token_id: int) -> int:
    """How much of `marker` is matched after `token_id`, `progress` tokens having been."""
    if marker[progress] == token_id:
        return progress + 1
    return 1 if marker[0] == token_id else 0


def _only(token_id: int, vocab_size: int) -> mx.array:
    return mx.arange(vocab_size) == token_id
