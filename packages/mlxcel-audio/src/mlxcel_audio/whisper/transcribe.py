"""Transcription of any length: 30-second windows, timestamps, temperature fallback.

Source: OpenAI `whisper/transcribe.py` (`transcribe`, `decode_with_fallback`), without
clip timestamps or hallucination-silence skipping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mlxcel_audio.decoding import SAMPLE_RATE
from mlxcel_audio.errors import AudioInputError, UnsupportedTaskError
from mlxcel_audio.features import HOP_LENGTH, N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from mlxcel_audio.whisper.decoding import (
    DecodingResult,
    decode_window,
    detect_language,
    encode_window,
)
from mlxcel_audio.whisper.languages import language_code
from mlxcel_audio.whisper.loading import WhisperModel
from mlxcel_audio.whisper.timing import TimedSpan, Word, add_word_timestamps
from mlxcel_audio.whisper.tokenizer import TIME_PRECISION

COMPRESSION_RATIO_THRESHOLD = 2.4  # above: repetitive, decode again hotter
LOGPROB_THRESHOLD = -1.0  # below: unsure, decode again hotter
NO_SPEECH_THRESHOLD = 0.6  # above, and unsure: the window is silence
CONDITION_TEMPERATURE_LIMIT = 0.5  # text sampled hotter than this does not prompt the next window
_FRAMES_PER_TOKEN = 2  # the encoder's stride: audio frames per timestamp step


@dataclass(frozen=True)
class TranscribeOptions:
    """What to do with the audio.

    Attributes:
        task: "transcribe" in the spoken language, or "translate" to English.
        language: a code or English name; None detects it (English on English-only models).
        prompt: text the speech continues (names, spelling, style).
        temperature: one temperature, or the fallback sequence tried in order while a
            window's text is repetitive or unsure; 0 is greedy. Each in [0, 1].
        word_timestamps: also time each word (one more decoder pass per window); the
            segments' times then follow their first and last words.

    Raises:
        AudioInputError: on construction, for an unknown task or language or a
            temperature out of range.
    """

    task: Literal["transcribe", "translate"] = "transcribe"
    language: str | None = None
    prompt: str | None = None
    temperature: float | tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    word_timestamps: bool = False

    def __post_init__(self) -> None:
        if self.task not in ("transcribe", "translate"):
            raise AudioInputError(f"task must be 'transcribe' or 'translate', got {self.task!r}")
        if self.language is not None:
            try:
                object.__setattr__(self, "language", language_code(self.language))
            except ValueError as error:
                raise AudioInputError(str(error)) from None
        if isinstance(self.temperature, list):
            object.__setattr__(self, "temperature", tuple(self.temperature))
        for value in self.temperatures:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise AudioInputError(f"temperature must be a number, got {value!r}")
            if not 0.0 <= value <= 1.0:
                raise AudioInputError(f"temperature must be between 0 and 1, got {value}")

    @property
    def temperatures(self) -> tuple[float, ...]:
        if isinstance(self.temperature, tuple):
            return self.temperature
        return (self.temperature,)


@dataclass(frozen=True)
class Segment:
    """A span of speech; times in seconds from the start of the audio; `words` is empty
    unless word timestamps were asked for."""

    id: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class Transcription:
    """The text of the audio, its language code, its duration in seconds, and segments."""

    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...]


def transcribe(
    whisper: WhisperModel, audio: np.ndarray, options: TranscribeOptions = TranscribeOptions()
) -> Transcription:
    """Transcribe (or translate) 16 kHz mono audio.

    Args:
        audio: float32 samples at 16 kHz, shape (num_samples,), as `decode_audio` returns.

    Raises:
        UnsupportedTaskError: translation, or a language other than English, asked of an
            English-only model.
    """
    tokenizer = whisper.tokenizer
    _check_task(whisper, options)
    features = log_mel_spectrogram(audio, whisper.dims.n_mels, padding=N_SAMPLES)
    content_frames = features.shape[0] - N_FRAMES
    language = options.language or ("en" if not whisper.is_multilingual else None)
    all_tokens: list[int] = []
    if options.prompt and options.prompt.strip():
        all_tokens = tokenizer.encode(" " + options.prompt.strip())
    prompt_reset_since = 0
    segments: list[Segment] = []
    seek = 0
    last_speech = 0.0  # seconds: the end of the last timed segment
    while seek < content_frames:
        window_frames = min(N_FRAMES, content_frames - seek)
        # Digital silence: Whisper would hallucinate words ("you") into it.
        if not np.any(audio[seek * HOP_LENGTH : (seek + window_frames) * HOP_LENGTH]):
            seek += window_frames
            continue
        cross_kv = encode_window(whisper, pad_or_trim(features[seek : seek + N_FRAMES]))
        if language is None:
            language = detect_language(whisper, cross_kv)
        sot_sequence = _sot_sequence(whisper, language, options.task)
        result = _decode_with_fallback(
            whisper, cross_kv, sot_sequence, all_tokens[prompt_reset_since:], options.temperatures
        )
        offset = seek * HOP_LENGTH / SAMPLE_RATE
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and result.avg_logprob <= LOGPROB_THRESHOLD:
            seek += window_frames
            continue
        spans, advance = _split_at_timestamps(
            result.tokens, tokenizer.timestamp_begin, window_frames
        )
        seek += advance if advance > 0 else window_frames  # never decode a window twice
        spans = [
            (start, end, tokens)
            for start, end, tokens in spans
            if start != end and tokenizer.decode(tokens).strip()
        ]
        # A closing timestamp token may lie past the end of the audio.
        duration = len(audio) / SAMPLE_RATE
        timed = [
            TimedSpan(round(offset + s, 3), round(min(offset + e, duration), 3), ())
            for s, e, _ in spans
        ]
        if options.word_timestamps and spans:
            timed = add_word_timestamps(
                whisper, cross_kv, spans, sot_sequence=sot_sequence, num_frames=window_frames,
                time_offset=offset, language=language, last_speech_timestamp=last_speech,
            )  # fmt: skip
            last_speech = timed[-1].end
        for (_, _, tokens), span in zip(spans, timed, strict=True):
            segments.append(Segment(
                id=len(segments), start=span.start, end=span.end,
                text=tokenizer.decode(tokens), tokens=tokens, temperature=result.temperature,
                avg_logprob=result.avg_logprob, compression_ratio=result.compression_ratio,
                no_speech_prob=result.no_speech_prob, words=span.words,
            ))  # fmt: skip
            all_tokens.extend(tokens)
        if result.temperature > CONDITION_TEMPERATURE_LIMIT:
            prompt_reset_since = len(all_tokens)
    return Transcription(
        text="".join(segment.text for segment in segments).strip(),
        language=language or "en",
        duration=len(audio) / SAMPLE_RATE,
        segments=tuple(segments),
    )


def _check_task(whisper: WhisperModel, options: TranscribeOptions) -> None:
    if whisper.is_multilingual:
        return
    if options.task == "translate":
        raise UnsupportedTaskError("this Whisper model is English-only: it cannot translate")
    if options.language not in (None, "en"):
        raise UnsupportedTaskError(
            f"this Whisper model is English-only: it cannot transcribe {options.language!r}"
        )


def _sot_sequence(whisper: WhisperModel, language: str, task: str) -> list[int]:
    tokenizer = whisper.tokenizer
    if not whisper.is_multilingual:
        return [tokenizer.sot]
    if language not in tokenizer.language_tokens:
        raise UnsupportedTaskError(
            f"the model {whisper.name} does not know the language {language!r}"
        )
    task_token = tokenizer.translate if task == "translate" else tokenizer.transcribe
    return [tokenizer.sot, tokenizer.language_tokens[language], task_token]


def _decode_with_fallback(
    whisper: WhisperModel, cross_kv: list, sot_sequence: list[int], prompt: list[int],
    temperatures: tuple[float, ...],
) -> DecodingResult:  # fmt: skip
    """Decode at each temperature in turn until the text is neither repetitive nor unsure
    (or unsure but silent)."""
    for temperature in temperatures:
        result = decode_window(
            whisper, cross_kv, sot_sequence=sot_sequence, prompt=prompt, temperature=temperature
        )
        unsure = result.avg_logprob < LOGPROB_THRESHOLD
        silent = result.no_speech_prob > NO_SPEECH_THRESHOLD and unsure
        repetitive = result.compression_ratio > COMPRESSION_RATIO_THRESHOLD
        if silent or not (repetitive or unsure):
            break
    return result


def _split_at_timestamps(
    tokens: tuple[int, ...], timestamp_begin: int, window_frames: int
) -> tuple[list[tuple[float, float, tuple[int, ...]]], int]:
    """A window's tokens as (start s, end s, tokens) spans within the window, and the frames
    to seek forward: to the last closed timestamp pair, or the whole window when the text
    ends with a single timestamp or has no pairs."""
    is_timestamp = [t >= timestamp_begin for t in tokens]
    pair_ends = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]
    single_ending = is_timestamp[-2:] == [False, True]
    window_seconds = window_frames * HOP_LENGTH / SAMPLE_RATE
    if not pair_ends:
        stamps = [t for t in tokens if t >= timestamp_begin]
        end = window_seconds
        if stamps and stamps[-1] != timestamp_begin:
            end = (stamps[-1] - timestamp_begin) * TIME_PRECISION
        return [(0.0, end, tuple(tokens))], window_frames
    if single_ending:
        pair_ends.append(len(tokens))
    spans = []
    start = 0
    for stop in pair_ends:
        piece = tokens[start:stop]
        spans.append((
            (piece[0] - timestamp_begin) * TIME_PRECISION,
            (piece[-1] - timestamp_begin) * TIME_PRECISION,
            tuple(piece),
        ))  # fmt: skip
        start = stop
    if single_ending:
        return spans, window_frames
    return spans, (tokens[start - 1] - timestamp_begin) * _FRAMES_PER_TOKEN
