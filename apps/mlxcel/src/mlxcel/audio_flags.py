"""`mlxcel serve`'s speech flags and the speech models they load, adapted to the server.

`--stt-model` (a Whisper folder) and `--tts-model` (a Piper voice's `.onnx` file) default to
the models of the `audio` extra when it is installed; `none` leaves one out and `--no-audio`
leaves both out.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mlxcel.flags import Flag, InputError, UsageError
from mlxcel_audio.decoding import decode_audio
from mlxcel_audio.default_models import (
    DEFAULT_STT_MODEL_NAME,
    default_stt_model,
    default_tts_voice,
)
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
from mlxcel_server import ServerSettings
from mlxcel_server.audio_models import ServingAudio, TranscriptionRequest
from mlxcel_server.audio_worker import AudioWorker

NONE = "none"

AUDIO_FLAGS = (
    Flag(("--stt-model",), "stt_model", str, None,
         "Whisper model folder (CTranslate2, Hugging Face or mlx-whisper) for "
         "/v1/audio/transcriptions and /v1/audio/translations, or 'none' "
         "(default: Whisper tiny.en of the audio extra, when installed)",
         env="MLXCEL_STT_MODEL"),
    Flag(("--tts-model",), "tts_model", str, None,
         "Piper voice (.onnx file, its .onnx.json beside it) for /v1/audio/speech, or 'none' "
         "(default: en_US-joe-medium of the audio extra, when installed)",
         env="MLXCEL_TTS_MODEL"),
    Flag(("--no-audio",), "no_audio", bool, False,
         "serve no speech models, not even the defaults", env="MLXCEL_NO_AUDIO", is_switch=True),
    Flag(("--audio-max-bytes",), "audio_max_bytes", int, 25 * 2**20,
         "largest audio upload (bytes, the whole request); larger ones get 413",
         env="MLXCEL_AUDIO_MAX_BYTES"),
)  # fmt: skip


@dataclass(frozen=True)
class SpeechModelPaths:
    """The speech models to load; None leaves one out."""

    stt: Path | None
    tts: Path | None


def _path(given: str | None, default: Path | None, flag: str) -> Path | None:
    if given is None:
        return default
    if given.lower() == NONE:
        return None
    path = Path(given).expanduser()
    if not path.exists():
        raise InputError(f"{flag}: no such file or folder: {given}")
    return path


def speech_model_paths(args: argparse.Namespace) -> SpeechModelPaths:
    """The speech models resolved flags ask for.

    Raises:
        UsageError: `--no-audio` is given with a model path.
        InputError: a given path does not exist.
    """
    if args.no_audio:
        named = [flag for flag, value in (("--stt-model", args.stt_model),
                                          ("--tts-model", args.tts_model))
                 if value is not None and value.lower() != NONE]  # fmt: skip
        if named:
            raise UsageError(f"--no-audio serves no speech models, but {named[0]} names one")
        return SpeechModelPaths(None, None)
    return SpeechModelPaths(
        stt=_path(args.stt_model, default_stt_model(), "--stt-model"),
        tts=_path(args.tts_model, default_tts_voice(), "--tts-model"),
    )


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


def serving_audio(paths: SpeechModelPaths, settings: ServerSettings) -> ServingAudio | None:
    """Load the speech models at `paths` with a worker admitting as many waiting requests
    as the engine does (`--max-queue`); None when there are none to serve.

    Raises:
        ModelLoadError: a model cannot be loaded.
    """
    if paths.stt is None and paths.tts is None:
        return None
    stt, tts = load_speech_models(paths)
    worker = AudioWorker(
        max_waiting=settings.engine.max_waiting,
        retry_after_seconds=settings.engine.retry_after_seconds,
    )
    return ServingAudio(stt, tts, worker, created=int(time.time()))
