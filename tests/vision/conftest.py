"""Tiny random-weight vision-language folders, shared by the vision tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from llava_factory import write_llava_model


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaVA folder as transformers' `save_pretrained` writes it."""
    return write_llava_model(tmp_path_factory.mktemp("llava") / "tiny-llava")
