"""Incremental detokenization: text as tokens arrive, never splitting a UTF-8 character."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

_REPLACEMENT_CHARACTER = "\ufffd"


class TokenDecoder(Protocol):
    """Anything that turns token ids into text, such as `mlxcel_models.tokenizer.Tokenizer`."""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of `ids`."""
        ...


class IncrementalDetokenizer:
    """Streams the text of a token sequence one token at a time.

    The prefix / read-offset technique of vLLM and Text Generation Inference: each step decodes
    only a short window of recent tokens, made of a prefix (tokens whose text was already
    emitted, kept as context so that decoders which look at neighbours, such as SentencePiece's
    leading-space strip, render the new tokens as they would in the full sequence) and the
    tokens not yet emitted. New text is released only when the window's text grows and does
    not end in U+FFFD, i.e. no UTF-8 character is left incomplete; then the unread tokens
    become the next prefix. Each step costs O(window), not O(tokens so far).

    The concatenation of every `add_token` result and `finalize()` equals
    `decoder.decode(all_tokens)`. One exception, for output that is not valid UTF-8: the
    SentencePiece byte-fallback decoder turns a whole run of byte tokens into one U+FFFD per
    byte when the run is invalid, so where a model emits invalid bytes the stream may place
    U+FFFD differently (it keeps the valid characters the full decode would blank).

    Args:
        decoder: What decodes token ids; it must be deterministic and context-free beyond
            the window (true of byte-level BPE and SentencePiece decoders).
        skip_special_tokens: Leave out special (control) tokens, as llama-server does for
            generated text unless asked to render them.
    """

    def __init__(self, decoder: TokenDecoder, *, skip_special_tokens: bool = True) -> None:
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        self._window: list[int] = []
        self._read_offset = 0
        self._prefix_text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def add_token(self, token_id: int) -> str:
        """Append one token; return the text that became final (possibly empty)."""
        self._window.append(int(token_id))
        text = self._decode(self._window)
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT_CHARACTER):
            return ""
        new_text = text[len(self._prefix_text) :]
        del self._window[: self._read_offset]
        self._read_offset = len(self._window)
        self._prefix_text = self._decode(self._window)
        return new_text

    def finalize(self) -> str:
        """Return the text still held back (an incomplete character decodes as U+FFFD) and reset."""
        text = self._decode(self._window)
        rest = text[len(self._prefix_text) :]
        self._window.clear()
        self._read_offset = 0
        self._prefix_text = ""
        return rest
