"""Whisper speech-to-text on MLX: `load_whisper` then `transcribe`."""

from mlxcel_audio.errors import UnsupportedTaskError
from mlxcel_audio.whisper.loading import WhisperModel, load_whisper
from mlxcel_audio.whisper.timing import Word
from mlxcel_audio.whisper.transcribe import Segment, TranscribeOptions, Transcription, transcribe

__all__ = [
    "Segment",
    "TranscribeOptions",
    "Transcription",
    "UnsupportedTaskError",
    "WhisperModel",
    "Word",
    "load_whisper",
    "transcribe",
]
