"""Errors raised for audio input a caller can fix; each carries a one-line message."""

from mlxcel_core.errors import InputError


class AudioInputError(InputError, ValueError):
    """The audio, text or options given cannot be used (empty, corrupt, out of range)."""


class MissingDecoderError(AudioInputError):
    """The audio is in a container only PyAV decodes, and PyAV is not installed."""


class UnsupportedTaskError(AudioInputError):
    """The model cannot do what was asked (translation or a non-English language on an
    English-only Whisper model)."""
