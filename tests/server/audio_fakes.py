"""Small speech models that honour the server's audio protocols, for fast in-process tests.

The speech-to-text fake really decodes its upload with soundfile (so broken uploads fail as
they would) and reports the decoded duration; the voice speaks one tone per sentence and
encodes with soundfile.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import soundfile

from mlxcel_server.audio_models import TranscriptionRequest

HEARD = "Hello world, this is a test."
SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class FakeSegment:
    id: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...] = (50363, 15496)
    temperature: float = 0.0
    avg_logprob: float = -0.25
    compression_ratio: float = 1.1
    no_speech_prob: float = 0.01


@dataclass(frozen=True)
class FakeTranscript:
    text: str
    language: str
    duration: float
    segments: tuple[FakeSegment, ...]


@dataclass
class FakeSpeechToText:
    """An English-only model that hears `HEARD` in any decodable audio.

    `gate`, when given, holds each call until it is set; `calls` counts the calls started.
    """

    name: str = "whisper-fake.en"
    gate: threading.Event | None = None
    calls: int = 0
    requests: list[TranscriptionRequest] = field(default_factory=list)

    def transcribe(self, upload: bytes, request: TranscriptionRequest) -> FakeTranscript:
        self.calls += 1
        self.requests.append(request)
        if self.gate is not None:
            self.gate.wait(timeout=30)
        if request.task == "translate":
            raise ValueError(f"{self.name} is an English-only model; it cannot translate")
        try:
            samples, rate = soundfile.read(io.BytesIO(upload), dtype="float32")
        except soundfile.LibsndfileError as error:
            raise ValueError(f"the upload is not audio soundfile can read: {error}") from error
        duration = len(samples) / rate
        middle = duration / 2
        segments = (
            FakeSegment(0, 0.0, middle, " Hello world,"),
            FakeSegment(1, middle, duration, " this is a test."),
        )
        return FakeTranscript(HEARD, "english", duration, segments)


@dataclass
class FakeVoice:
    """A voice speaking one 0.25-second tone per sentence."""

    name: str = "en_US-fake-medium"
    sample_rate: int = 22_050
    speakers: tuple[str, ...] = ()
    audio_formats: tuple[str, ...] = ("wav", "flac", "mp3", "pcm")

    def synthesize(self, text: str, *, speaker: str | None, speed: float) -> Iterator[np.ndarray]:
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]
        if any(not any(c.isalnum() for c in s) for s in sentences):
            raise ValueError("the text has a sentence with nothing to speak")
        length = int(self.sample_rate * 0.25 / speed)
        for number, _ in enumerate(sentences):
            time = np.arange(length, dtype=np.float32) / self.sample_rate
            yield (0.5 * np.sin(2 * np.pi * (220 + 110 * number) * time)).astype(np.float32)

    def encode(self, samples: np.ndarray, audio_format: str) -> bytes:
        if audio_format == "pcm":
            return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
        container, subtype = {
            "wav": ("WAV", "PCM_16"),
            "flac": ("FLAC", "PCM_16"),
            "mp3": ("MP3", "MPEG_LAYER_III"),
        }[audio_format]
        buffer = io.BytesIO()
        soundfile.write(buffer, samples, self.sample_rate, format=container, subtype=subtype)
        return buffer.getvalue()


def wav_bytes(seconds: float = 1.0, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A mono 16-bit WAV file of a 440 Hz tone."""
    time = np.arange(int(seconds * sample_rate), dtype=np.float32) / sample_rate
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * 440 * time), sample_rate, format="WAV")
    return buffer.getvalue()


def mp3_bytes(seconds: float = 1.0, sample_rate: int = SAMPLE_RATE) -> bytes:
    """An MP3 file of a 440 Hz tone."""
    time = np.arange(int(seconds * sample_rate), dtype=np.float32) / sample_rate
    buffer = io.BytesIO()
    soundfile.write(
        buffer, 0.3 * np.sin(2 * np.pi * 440 * time), sample_rate, format="MP3",
        subtype="MPEG_LAYER_III",
    )  # fmt: skip
    return buffer.getvalue()
