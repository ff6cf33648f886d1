"""`mlxcel serve`'s speech flags: which speech models the server loads (`speech_models`).

`--stt-model` (a Whisper folder) and `--tts-model` (a Piper voice's `.onnx` file) default to
the models of the `audio` extra when it is installed; `none` leaves one out and `--no-audio`
leaves both out. Without the extra (mlxcel-audio and its models) the server serves no
speech models, and naming one is a usage error.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mlxcel.common.flags import Flag, UsageError, import_extra
from mlxcel_core.errors import InputError
from mlxcel_server import ServerSettings
from mlxcel_server.audio_models import ServingAudio
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
        UsageError: `--no-audio` is given with a model path, or a model is named (or the
            extra's model found) but the audio extra cannot be imported.
        InputError: a given path does not exist.
    """
    if args.no_audio:
        named = [flag for flag, value in (("--stt-model", args.stt_model),
                                          ("--tts-model", args.tts_model))
                 if value is not None and value.lower() != NONE]  # fmt: skip
        if named:
            raise UsageError(f"--no-audio serves no speech models, but {named[0]} names one")
        return SpeechModelPaths(None, None)
    default_stt, default_tts = _default_paths()
    paths = SpeechModelPaths(
        stt=_path(args.stt_model, default_stt, "--stt-model"),
        tts=_path(args.tts_model, default_tts, "--tts-model"),
    )
    if paths.stt is not None or paths.tts is not None:
        _speech_models()
    return paths


def _default_paths() -> tuple[Path | None, Path | None]:
    try:
        from mlxcel_audio.default_models import default_stt_model, default_tts_voice
    except ImportError:
        return None, None
    return default_stt_model(), default_tts_voice()


def _speech_models() -> ModuleType:
    """`mlxcel.speech.speech_models`, which needs the audio extra.

    Raises:
        UsageError: the extra is not installed.
    """
    return import_extra(
        "mlxcel.speech.speech_models", extra="audio", needed_by="serving speech models"
    )


def serving_audio(paths: SpeechModelPaths, settings: ServerSettings) -> ServingAudio | None:
    """Load the speech models at `paths` with a worker admitting as many waiting requests
    as the engine does (`--max-queue`); None when there are none to serve.

    Raises:
        ModelLoadError: a model cannot be loaded.
    """
    if paths.stt is None and paths.tts is None:
        return None
    stt, tts = _speech_models().load_speech_models(paths)
    worker = AudioWorker(
        max_waiting=settings.engine.max_waiting,
        retry_after_seconds=settings.engine.retry_after_seconds,
    )
    return ServingAudio(stt, tts, worker, created=int(time.time()))
