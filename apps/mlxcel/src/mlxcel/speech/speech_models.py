"""The server's speech models: a Whisper model and a Piper voice behind the interfaces of
`mlxcel_server.audio_models`. Needs the audio extra (`pip install 'mlxcel[audio]'`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from mlxcel_audio.decoding import decode_audio
from mlxcel_audio.default_models import DEFAULT_STT_MODEL_NAME, default_stt_model
from mlxcel_audio.encoding import AUDIO_FORMATS, UnsupportedAudioFormatError, encode_audio
from mlxcel_audio.piper import PiperVoice, load_voice
from mlxcel_audio.whisper import (
    TranscribeOptions,
    Transcription,
    WhisperModel,
    load_whisper,
    transcribe,
)
from mlxcel_audio.whisper.languages import LANGUAGES
from mlxcel_server.audio_models import TranscriptionRequest

if TYPE_CHECKING:
    # audio_flags imports this module when it loads speech models.
    from mlxcel.speech.audio_flags import SpeechModelPaths


@dataclass(frozen=True)
class WhisperSpeechToText:
    """A Whisper model as the server's `SpeechToText`."""

    name: str
    model: WhisperModel

    def transcribe(self, upload: bytes, request: TranscriptionRequest) -> Transcription:
        """Decode `upload` (any container, by content) and transcribe it; the language is
        reported by name ("english"), as OpenAI does.

        Raises:
            AudioInputError: the upload is not usable audio, a field is invalid, or the
                model cannot do the task.
        """
        fields = {"temperature": request.temperature} if request.temperature is not None else {}
        options = TranscribeOptions(
            task=request.task, language=request.language, prompt=request.prompt,
            word_timestamps=request.word_timestamps, **fields,
        )  # fmt: skip
        transcription = transcribe(self.model, decode_audio(upload), options)
        language = LANGUAGES.get(transcription.language, transcription.language)
        return replace(transcription, language=language)


@dataclass(frozen=True)
class PiperTextToSpeech:
    """A Piper voice as the server's `TextToSpeech`; `audio_formats` are those the installed
    encoders can write."""

    name: str
    voice: PiperVoice
    audio_formats: tuple[str, ...]

    @property
    def sample_rate(self) -> int:
        return self.voice.sample_rate

    @property
    def speakers(self) -> tuple[str, ...]:
        return self.voice.speakers

    def synthesize(self, text: str, *, speaker: str | None, speed: float) -> Iterator[np.ndarray]:
        return self.voice.synthesize(text, speaker=speaker, speed=speed)

    def encode(self, samples: np.ndarray, audio_format: str) -> bytes:
        return encode_audio(samples, self.voice.sample_rate, audio_format)


def load_speech_models(
    paths: SpeechModelPaths,
) -> tuple[WhisperSpeechToText | None, PiperTextToSpeech | None]:
    """Load the speech models at `paths`, named as the API will name them: the default
    Whisper model "whisper-tiny.en", another its folder's name; a voice its file's stem.

    Raises:
        ModelLoadError: a model cannot be loaded.
    """
    stt = tts = None
    if paths.stt is not None:
        is_default = paths.stt == default_stt_model()
        name = DEFAULT_STT_MODEL_NAME if is_default else paths.stt.name
        stt = WhisperSpeechToText(name, load_whisper(paths.stt))
    if paths.tts is not None:
        voice = load_voice(paths.tts)
        tts = PiperTextToSpeech(paths.tts.stem, voice, _writable_formats(voice.sample_rate))
    return stt, tts


def _writable_formats(sample_rate: int) -> tuple[str, ...]:
    # libsndfile builds differ (MP3 and Opus need 1.1+), so each format is tried once.
    silence = np.zeros(sample_rate // 100, dtype=np.float32)
    writable = []
    for audio_format in AUDIO_FORMATS:
        try:
            encode_audio(silence, sample_rate, audio_format)
        except UnsupportedAudioFormatError:
            continue
        writable.append(audio_format)
    return tuple(writable)
