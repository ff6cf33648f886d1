"""Stop criteria beside the token budget: stop strings matched on streamed text, across token
boundaries, never leaked; and stop tokens kept from being drawn while a request asks for a
minimum length (`min_tokens`) or to ignore end of sequence (`ignore_eos`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class StopTokenBan:
    """Stop tokens a request may not draw yet, as vLLM's `min_tokens` and llama-server's
    `ignore_eos` keep them out: their logits are set to -inf before the sampler chain, so the
    distribution over the other tokens is unchanged.

    Attributes:
        token_ids: the request's stop tokens (EOS, end of turn).
        min_tokens: they are banned while fewer tokens than this have been generated.
        ignore_eos: they are banned for the whole generation.

    Raises:
        ValueError: `min_tokens` is negative.
    """

    token_ids: frozenset[int] = frozenset()
    min_tokens: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")

    def banned(self, num_generated: int) -> frozenset[int]:
        """The stop tokens banned for the draw that follows `num_generated` tokens."""
        if self.ignore_eos or num_generated < self.min_tokens:
            return self.token_ids
        return frozenset()


def ban_tokens(logits: mx.array, banned: Sequence[frozenset[int]]) -> mx.array:
    """Logits with each row's banned token ids at -inf.

    Args:
        logits: (rows, V) float logits.
        banned: one set of token ids per row; ids >= V are ignored.

    Returns:
        (rows, V) logits; `logits` itself when nothing is banned.
    """
    vocab_size = logits.shape[-1]
    pairs = [(row, token) for row, ids in enumerate(banned) for token in ids if token < vocab_size]
    if not pairs:
        return logits
    rows, tokens = zip(*pairs, strict=True)
    return logits.at[mx.array(rows), mx.array(tokens)].add(-math.inf)


def ban_unless_alone(allowed: mx.array, banned: frozenset[int]) -> frozenset[int]:
    """`banned`, or nothing when a token constraint allows no other token: a grammar that
    is complete allows only stop tokens, and must still be able to end.

    Args:
        allowed: (V,) bool, the constraint's allowed tokens.
        banned: the stop tokens banned now.
    """
    if not banned:
        return banned
    ids = mx.array([token for token in banned if token < allowed.shape[0]], dtype=mx.int32)
    others = allowed.at[ids].multiply(False) if ids.size else allowed
    return banned if mx.any(others).item() else frozenset()


@dataclass(frozen=True)
class StopMatch:
    """What a piece of streamed text released.

    Attributes:
        text: text safe to show now (everything before any stop string).
        stopped: True once a stop string has been seen; later text is dropped.
    """

    text: str
    stopped: bool


class StopStringMatcher:
    """Holds back text that could still turn into a stop string.

    After each piece, the longest tail of the pending text that is a prefix of some stop
    string is kept back; everything before it is released. When a stop string appears
    whole, the text before it is released and the rest is discarded.

    Args:
        stop_strings: strings that end generation; empty strings are ignored.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stop_strings = tuple(s for s in stop_strings if s)
        self._pending = ""
        self._stopped = False

    def feed(self, text: str, *, may_stop: bool = True) -> StopMatch:
        """Add newly decoded text; return what may be shown and whether to stop.

        With `may_stop` False (a minimum length not reached yet), whole stop strings are
        released as text; only a tail that could still become one is held back.
        """
        if self._stopped:
            return StopMatch("", True)
        pending = self._pending + text
        first_stop = min(
            (index for s in self._stop_strings if may_stop and (index := pending.find(s)) >= 0),
            default=-1,
        )
        if first_stop >= 0:
            self._pending, self._stopped = "", True
            return StopMatch(pending[:first_stop], True)
        held = self._held_back_length(pending)
        self._pending = pending[len(pending) - held :]
        return StopMatch(pending[: len(pending) - held], False)

    def flush(self) -> str:
        """Release the text held back when generation ends for another reason."""
        pending, self._pending = self._pending, ""
        return "" if self._stopped else pending

    def _held_back_length(self, text: str) -> int:
        longest = 0
        for stop in self._stop_strings:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
