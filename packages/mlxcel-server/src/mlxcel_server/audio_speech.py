"""`POST /v1/audio/speech`: its request body, voice choice and the audio stream it answers.

Audio is sent sentence by sentence (a long sentence piece by piece) as the voice speaks it
for `pcm` (16-bit little-endian mono) and `wav` (a header with an open length, then 16-bit
samples, as OpenAI streams it).
Files of the other formats cannot be joined (an MP3 file's Xing header gives its frame count,
so decoders stop after the first), so they are encoded once the last sentence is spoken.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from mlxcel_server.audio_models import TextToSpeech
from mlxcel_server.errors import invalid

MAX_INPUT_CHARS = 4096
MIN_SPEED = 0.25
MAX_SPEED = 4.0
# The voices OpenAI's speech endpoint accepts; a one-speaker voice answers to all of them.
OPENAI_VOICES = frozenset(
    {
        "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable",
        "marin", "nova", "onyx", "sage", "shimmer", "verse",
    }
)  # fmt: skip
_MIME_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# RIFF and data sizes of a stream whose length is not known yet.
_OPEN_LENGTH = 0xFFFFFFFF


class SpeechRequest(BaseModel):
    """The JSON body of `POST /v1/audio/speech` (OpenAI's fields)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    model: str | None = None
    voice: str | None = None
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    stream_format: Literal["audio", "sse"] = "audio"


def choose_speaker(voice: TextToSpeech, name: str | None) -> str | None:
    """The speaker `name` asks for, by its name: None is the voice's default speaker.

    A one-speaker voice answers to its own name and OpenAI's voice names; a multi-speaker
    voice to its speakers' names, their ids in ASCII decimal (a name wins over an id it spells)
    and its own name (the default speaker).

    Raises:
        ApiError: 400 naming the voices this server has.
    """
    if name is None or name == voice.name:
        return None
    if voice.speakers:
        if name in voice.speakers:
            return name
        if name.isascii() and name.isdecimal() and int(name) < len(voice.speakers):
            return voice.speakers[int(name)]
        shown = ", ".join(voice.speakers[:10])
        raise invalid(
            f"voice {name!r} is not a speaker of {voice.name!r}; try {shown} "
            f"or an id below {len(voice.speakers)}",
            "voice",
        )
    if name in OPENAI_VOICES:
        return None
    raise invalid(
        f"voice {name!r} is unknown: {voice.name!r} has one speaker, named {voice.name!r} "
        "or any of OpenAI's voice names (alloy, echo, ...)",
        "voice",
    )


def check_format(voice: TextToSpeech, audio_format: str) -> None:
    """Raises: ApiError: 400 when the voice's encoder cannot write `audio_format`."""
    if audio_format not in voice.audio_formats:
        raise invalid(
            f"response_format {audio_format!r} is not supported by this server's audio encoder; "
            f"use one of {', '.join(voice.audio_formats)}",
            "response_format",
        )


def mime_type(audio_format: str) -> str:
    """The content type of a speech response in `audio_format`."""
    return _MIME_TYPES[audio_format]


def _pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def _open_wav_header(sample_rate: int) -> bytes:
    return b"".join(
        [
            b"RIFF",
            struct.pack("<I", _OPEN_LENGTH),
            b"WAVEfmt ",
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16),
            b"data",
            struct.pack("<I", _OPEN_LENGTH),
        ]
    )


async def audio_stream(
    voice: TextToSpeech, sentences: AsyncIterator[np.ndarray], audio_format: str
) -> AsyncIterator[bytes]:
    """The response body of `stream_format=audio` over the spoken sentences."""
    if audio_format in ("wav", "pcm"):
        if audio_format == "wav":
            yield _open_wav_header(voice.sample_rate)
        async for samples in sentences:
            yield _pcm16(samples)
    else:
        spoken = [samples async for samples in sentences]
        yield voice.encode(np.concatenate(spoken), audio_format)


async def sse_stream(
    voice: TextToSpeech, sentences: AsyncIterator[np.ndarray], audio_format: str
) -> AsyncIterator[bytes]:
    """The response body of `stream_format=sse`: OpenAI's `speech.audio.delta` events (the
    base64 audio of each sentence), then `speech.audio.done`."""
    async for chunk in audio_stream(voice, sentences, audio_format):
        delta = {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
        yield f"data: {json.dumps(delta)}\n\n".encode()
    yield b'data: {"type": "speech.audio.done"}\n\n'
