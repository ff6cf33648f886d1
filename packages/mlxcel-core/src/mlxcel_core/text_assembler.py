"""One sequence's stop criteria applied to its sampled tokens, and its text assembled."""

from __future__ import annotations

import time
from collections.abc import Callable

from mlxcel_core.request import Detokenizer, FinishReason, GenerationConfig
from mlxcel_core.stopping import StopStringMatcher


class TextAssembler:
    """Applies one sequence's stop criteria to its sampled tokens and assembles its text.

    Generation ends with `FinishReason.STOP` on a stop token or stop string (a stop string
    only from `min_tokens` tokens on), and with `FinishReason.LENGTH` at `max_tokens`, when
    the context window is full, or past `max_predict_seconds` once the text holds a newline.
    Stop tokens and stop strings are never part of the text.

    Args:
        detokenizer: the sequence's own incremental detokenizer.
        config: its limits and stop criteria.
        num_prompt_tokens: its prompt length (tokens).
        clock: seconds from an arbitrary origin (`time.perf_counter`).

    Raises:
        ContextOverflowError: the prompt fills the whole context window.
    """

    def __init__(
        self,
        detokenizer: Detokenizer,
        config: GenerationConfig,
        num_prompt_tokens: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        budget = config.token_budget(num_prompt_tokens)
        self.budget = budget
        self.num_generated = 0
        self.finish_reason: FinishReason | None = FinishReason.LENGTH if budget == 0 else None
        self._detokenizer = detokenizer
        self._stop_token_ids = config.stop_token_ids
        self._matcher = StopStringMatcher(config.stop_strings)
        self._min_tokens = config.min_tokens
        self._ban = config.stop_token_ban
        self._max_predict_seconds = config.max_predict_seconds
        self._clock = clock
        self._first_token_time = 0.0
        self._has_newline = False

    def banned_token_ids(self, ahead: int = 0) -> frozenset[int]:
        """The stop tokens the draw `ahead` tokens after the next one may not give (see
        `GenerationConfig.min_tokens` and `ignore_eos`)."""
        return self._ban.banned(self.num_generated + ahead)

    def add(self, token_id: int) -> str:
        """Take one sampled token; return the text it makes final.

        Sets `finish_reason` when this token ends the sequence.

        Raises:
            ValueError: the sequence has already finished.
        """
        if self.finish_reason is not None:
            raise ValueError("the sequence has already finished")
        self.num_generated += 1
        if self.num_generated == 1:
            self._first_token_time = self._clock()
        if token_id in self._stop_token_ids:
            self.finish_reason = FinishReason.STOP
            return ""
        text = self._detokenizer.add_token(token_id)
        self._has_newline = self._has_newline or "\n" in text
        match = self._matcher.feed(text, may_stop=self.num_generated >= self._min_tokens)
        if match.stopped:
            self.finish_reason = FinishReason.STOP
        elif self.num_generated == self.budget or self._out_of_time():
            self.finish_reason = FinishReason.LENGTH
        return match.text

    def _out_of_time(self) -> bool:
        limit = self._max_predict_seconds
        return (
            limit is not None
            and self._has_newline
            and self._clock() - self._first_token_time > limit
        )

    def finish(self) -> str:
        """The text still held back, once the sequence has ended (a stop string may still
        complete in it, which makes the finish reason `STOP`)."""
        may_stop = self.num_generated >= self._min_tokens
        rest = self._matcher.feed(self._detokenizer.finalize(), may_stop=may_stop)
        if rest.stopped:
            self.finish_reason = FinishReason.STOP
            return rest.text
        return rest.text + self._matcher.flush()
