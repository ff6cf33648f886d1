"""What the audio endpoints need from a speech-to-text model and a text-to-speech voice.

The server holds them through these protocols; the command line adapts mlxcel-audio's Whisper
models and Piper voices to them. Everything the protocols raise for unusable input is a
`ValueError` whose message is shown to the client (mlxcel-audio's `AudioInputError`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from mlxcel_server.audio_totals import AudioTotals
from mlxcel_server.audio_worker import AudioWorker

STT_ALIASES = ("whisper-1",)
TTS_ALIASES = ("tts-1", "tts-1-hd")


class TranscriptWord(Protocol):
    """One timed word (times in seconds from the start of the audio)."""

    @property
    def word(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...


class TranscriptSegment(Protocol):
    """One timed piece of a transcript (times in seconds from the start of the audio); its
    `words` are read only when word timestamps were asked for."""

    @property
    def id(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def text(self) -> str: ...
    @property
    def tokens(self) -> Sequence[int]: ...
    @property
    def temperature(self) -> float: ...
    @property
    def avg_logprob(self) -> float: ...
    @property
    def compression_ratio(self) -> float: ...
    @property
    def no_speech_prob(self) -> float: ...
    @property
    def words(self) -> Sequence[TranscriptWord]: ...


class Transcript(Protocol):
    """A whole transcript: its text, language (a name such as "english"), duration (seconds of
    audio) and segments."""

    @property
    def text(self) -> str: ...
    @property
    def language(self) -> str: ...
    @property
    def duration(self) -> float: ...
    @property
    def segments(self) -> Sequence[TranscriptSegment]: ...


@dataclass(frozen=True)
class TranscriptionRequest:
    """The decoding choices of one transcription request.

    Attributes:
        task: "transcribe" keeps the spoken language; "translate" turns it into English.
        language: the spoken language's code ("en"); None detects it.
        prompt: text that precedes the audio (spelling, style, the previous part).
        temperature: one sampling temperature; None uses the model's fallback schedule.
        word_timestamps: time each word too (the segments' `words`).
    """

    task: Literal["transcribe", "translate"] = "transcribe"
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    word_timestamps: bool = False


class SpeechToText(Protocol):
    """A loaded speech-to-text model."""

    @property
    def name(self) -> str:
        """The model's name in the API (e.g. "whisper-tiny.en")."""
        ...

    def transcribe(self, upload: bytes, request: TranscriptionRequest) -> Transcript:
        """Decode an uploaded audio file (any container, detected from its content) and
        transcribe it.

        Raises:
            ValueError: the upload is not usable audio, or the model cannot do the task.
        """
        ...


class TextToSpeech(Protocol):
    """A loaded text-to-speech voice."""

    @property
    def name(self) -> str:
        """The voice's name in the API (e.g. "en_US-joe-medium")."""
        ...

    @property
    def sample_rate(self) -> int:
        """Samples per second of the audio it makes (Hz)."""
        ...

    @property
    def speakers(self) -> tuple[str, ...]:
        """Speaker names of a multi-speaker voice in id order; empty for one speaker."""
        ...

    @property
    def audio_formats(self) -> tuple[str, ...]:
        """The `response_format` values `encode` can write."""
        ...

    def synthesize(self, text: str, *, speaker: str | None, speed: float) -> Iterator[np.ndarray]:
        """Speak `text`: float32 mono samples in [-1, 1], one array per sentence (or per piece
        of a long sentence).

        Raises:
            ValueError: the text, speaker or speed is not usable.
        """
        ...

    def encode(self, samples: np.ndarray, audio_format: str) -> bytes:
        """`samples` (float32, mono, at `sample_rate`) as a file of `audio_format`."""
        ...


@dataclass(frozen=True)
class ServingAudio:
    """The speech models a server serves, with the worker that runs them.

    Attributes:
        stt: the speech-to-text model, or None.
        tts: the text-to-speech voice, or None.
        worker: runs their work off the event loop.
        totals: requests and seconds of audio done so far (for `/metrics`).
        created: Unix time (seconds) the models became ready, reported by `/v1/models`.
    """

    stt: SpeechToText | None
    tts: TextToSpeech | None
    worker: AudioWorker
    totals: AudioTotals = field(default_factory=AudioTotals, compare=False)
    created: int = 0

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names of the served speech models."""
        return tuple(model.name for model in (self.stt, self.tts) if model is not None)


def answers_to(model: SpeechToText | TextToSpeech, aliases: tuple[str, ...], name: str) -> bool:
    """Whether the request's `model` field names `model`: its name or an OpenAI alias."""
    return name == model.name or name in aliases
