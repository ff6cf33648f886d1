"""Text-to-speech with Piper (VITS) voices on MLX."""

from mlxcel_audio.piper.errors import VoiceLoadError
from mlxcel_audio.piper.model import Synthesis
from mlxcel_audio.piper.voice import MAX_SPEED, MIN_SPEED, PiperVoice, load_voice

__all__ = ["MAX_SPEED", "MIN_SPEED", "PiperVoice", "Synthesis", "VoiceLoadError", "load_voice"]
