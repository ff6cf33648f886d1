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
        answer_start_ids: for channel-style formats, the tokens that open the answer after
            framing (gpt-oss's `<|channel|>final<|message|>`); empty when the answer follows
            `end_ids` directly. Between the span and them, another span may open.

    Raises:
        ValueError: `start_ids` or `end_ids` is empty.
    """

    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    answer_start_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("start_ids", "end_ids", "answer_start_ids"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.start_ids or not self.end_ids:
            raise ValueError(f"reasoning markers must have tokens, got {self!r}")


@dataclass(frozen=True)
class _State:
    phase: ReasoningPhase
    num_tokens: int  # tokens seen inside spans, the end marker's matched part included
    progress: tuple[int, ...]  # per awaited marker, its leading tokens matched so far
    fed_inner: bool  # whether the step that led here advanced the inner constraint


class ReasoningTracker:
    """A `TokenConstraint` that follows the reasoning span and enforces a budget.

    Inside the span every token is allowed until `budget` reasoning tokens have been drawn;
    then only the end marker's tokens are, one by one, and the answer continues after them
    (as llama.cpp's reasoning budget does). An `inner` constraint (a grammar) applies to
    the answer only; before a span opens, it applies together with the opening markers, so
    the model may still open one (once it starts to, it must finish the marker). Framing
    between a channel-style span and its answer is not constrained.

    Without a budget or inner constraint it allows everything and only counts, so the same
    class measures `reasoning_tokens` from a stream of token ids.

    Args:
        tokens: the marker token ids.
        phase: where the reply starts (`REASONING` when the prompt opened the span,
            `ANSWER` when it closed it).
        budget: most reasoning tokens (over all spans), or None for no limit.
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
        self._state = self._entering(phase, 0, fed_inner=False)
        self._history: list[_State] = []

    @property
    def phase(self) -> ReasoningPhase:
        return self._state.phase

    @property
    def num_reasoning_tokens(self) -> int:
        """Tokens drawn inside spans so far, markers excluded."""
        state = self._state
        in_end_marker = state.progress[0] if state.phase is ReasoningPhase.REASONING else 0
        return state.num_tokens - in_end_marker

    def _awaited(self, phase: ReasoningPhase) -> list[tuple[tuple[int, ...], ReasoningPhase]]:
        """The markers that end `phase`, each with the phase it leads to."""
        tokens = self._tokens
        answer = (
            [(tokens.answer_start_ids, ReasoningPhase.ANSWER)] if tokens.answer_start_ids else []
        )
        if phase is ReasoningPhase.REASONING:
            after = ReasoningPhase.BETWEEN if tokens.answer_start_ids else ReasoningPhase.ANSWER
            return [(tokens.end_ids, after)]
        if phase is ReasoningPhase.ANSWER:
            return []
        return [(tokens.start_ids, ReasoningPhase.REASONING), *answer]

    def _entering(self, phase: ReasoningPhase, num_tokens: int, *, fed_inner: bool) -> _State:
        return _State(phase, num_tokens, (0,) * len(self._awaited(phase)), fed_inner)

    def _budget_spent(self) -> bool:
        return self._budget is not None and self.num_reasoning_tokens >= self._budget

    def allowed_mask(self, vocab_size: int) -> mx.array:
        """(V,) bool: the tokens allowed next (see the class)."""
        state = self._state
        everything = mx.ones((vocab_size,), dtype=mx.bool_)
        if state.phase is ReasoningPhase.ANSWER:
            return everything if self._inner is None else self._inner.allowed_mask(vocab_size)
        if state.phase is ReasoningPhase.REASONING:
            if self._budget_spent():
                return _only([self._tokens.end_ids[state.progress[0]]], vocab_size)
            return everything
        if self._inner is None or state.phase is ReasoningPhase.BETWEEN:
            return everything
        awaited = self._awaited(state.phase)
        if any(state.progress):
            return _only(
                [ids[p] for (ids, _), p in zip(awaited, state.progress, strict=True) if p],
                vocab_size,
            )
        return self._inner.allowed_mask(vocab_size) | _only(
            [ids[0] for ids, _ in awaited], vocab_size
        )

    def advance(self, token_id: int) -> None:
        """Record the token drawn.

        Raises:
            ValueError: the budget or the inner constraint does not allow `token_id`.
        """
        state = self._state
        if state.phase is ReasoningPhase.ANSWER:
            if self._inner is not None:
                self._inner.advance(token_id)
            new = self._entering(state.phase, state.num_tokens, fed_inner=self._inner is not None)
            self._history.append(state)
            self._state = new
            return
        awaited = self._awaited(state.phase)
        progress = tuple(
            _match(ids, p, token_id) for (ids, _), p in zip(awaited, state.progress, strict=True)
        )
        inside = state.phase is ReasoningPhase.REASONING
        if inside and self._budget_spent() and progress[0] != state.progress[0] + 1:
            raise ValueError(f"the reasoning budget is spent; token {token_id} cannot follow")
        num_tokens = state.num_tokens + inside
        done = [
            (ids, phase) for (ids, phase), p in zip(awaited, progress, strict=True) if p == len(ids)
        ]
        if done:
            ids, phase = done[0]
            new = self._entering(phase, num_tokens - (len(ids) if inside else 0), fed_inner=False)
        elif state.phase is ReasoningPhase.BEFORE and self._inner is not None and not any(progress):
            # Answer text before any span: the answer has begun, under its constraint.
            self._inner.advance(token_id)
            new = self._entering(ReasoningPhase.ANSWER, num_tokens, fed_inner=True)
        else:
            new = _State(state.phase, num_tokens, progress, False)
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


def _only(token_ids: Sequence[int], vocab_size: int) -> mx.array:
    mask = mx.zeros((vocab_size,), dtype=mx.bool_)
    mask[mx.array(token_ids)] = True
    return mask
