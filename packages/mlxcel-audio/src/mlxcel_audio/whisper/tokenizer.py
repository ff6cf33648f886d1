"""Whisper's tokenizer: the BPE vocabulary of tokenizer.json plus its special tokens.

Source: OpenAI `whisper/tokenizer.py`. Timestamp tokens follow `<|notimestamps|>`, one per
20 ms, and are absent from tokenizer.json: their ids are computed, not looked up.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from mlxcel_audio.whisper.languages import LANGUAGES
from mlxcel_models.errors import ModelLoadError

TIME_PRECISION = 0.02  # seconds per timestamp token


class WhisperTokenizer:
    """Text <-> token ids, and the ids of Whisper's special tokens.

    Attributes:
        eot, sot, sot_prev, sot_lm, no_speech, no_timestamps, transcribe, translate: the
            special tokens' ids.
        timestamp_begin: the id of `<|0.00|>`; `timestamp_begin + i` is i * 20 ms.
        language_tokens: language code -> token id, for the languages the vocabulary holds.
    """

    def __init__(self, tokenizer: Tokenizer, *, num_languages: int):
        self._tokenizer = tokenizer
        self.eot = self._special("<|endoftext|>")
        self.sot = self._special("<|startoftranscript|>")
        self.sot_prev = self._special("<|startofprev|>")
        self.sot_lm = self._special("<|startoflm|>")
        self.no_speech = self._special("<|nospeech|>", "<|nocaptions|>")
        self.no_timestamps = self._special("<|notimestamps|>")
        self.transcribe = self._special("<|transcribe|>")
        self.translate = self._special("<|translate|>")
        self.timestamp_begin = self.no_timestamps + 1
        codes = list(LANGUAGES)[:num_languages]
        self.language_tokens = {code: self.sot + 1 + i for i, code in enumerate(codes)}

    @classmethod
    def from_file(cls, path: Path, *, num_languages: int) -> WhisperTokenizer:
        """Raises ModelLoadError when the file is missing or not a Whisper tokenizer."""
        if not path.is_file():
            raise ModelLoadError(f"{path} not found: Whisper models need their tokenizer.json")
        try:
            return cls(Tokenizer.from_file(str(path)), num_languages=num_languages)
        except Exception as error:  # tokenizers raises a bare Exception on a bad file
            raise ModelLoadError(f"{path} is not a Whisper tokenizer: {error}") from None

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int] | tuple[int, ...]) -> str:
        """The text of `tokens`; special and timestamp tokens are left out."""
        return self._tokenizer.decode([t for t in tokens if t < self.eot])

    def non_speech_tokens(self) -> list[int]:
        """Tokens of symbols that are rarely speech (OpenAI's `non_speech_tokens`)."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += [
            "<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", '("', "((", "))", "(((",
            ")))", "[[", "]]", "{{", "}}", "♪♪", "♪♪♪",
        ]  # fmt: skip
        miscellaneous = set("♩♪♫♬♭♮♯")
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return sorted(result)

    def _special(self, *names: str) -> int:
        for name in names:
            token = self._tokenizer.token_to_id(name)
            if token is not None:
                return token
        raise ModelLoadError(f"the tokenizer lacks Whisper's special token {names[0]}")
