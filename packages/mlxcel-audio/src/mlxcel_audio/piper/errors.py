"""Errors raised loading a Piper voice."""

from mlxcel_models.errors import ModelLoadError


class VoiceLoadError(ModelLoadError):
    """A Piper voice's ONNX file or JSON config is missing, unreadable or not a VITS voice."""
