"""Abandoning an engine whose thread is blocked inside a step (as rank 0's is in a
collective whose peer hangs): every unfinished request ends at once with the error."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import mlx.core as mx
import pytest

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_core.engine import (
    Engine,
    EngineClosedError,
    EngineRequest,
    EngineUnavailableError,
    OutputQueue,
)
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams

VOCAB = 16
# Bounds every wait, so a broken abandon fails instead of hanging.
WAIT_SECONDS = 10.0


class HangingModel:
    """Predicts `token + 1`; once `hang` is set, a forward pass blocks until `release`."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.hung = threading.Event()
        self.release = threading.Event()

    def make_cache(self) -> list[KVCache]:
        return [DenseKVCache(step=8)]

    def __call__(self, tokens: mx.array, cache: Sequence[KVCache], *, last_only=False):
        if self.hang.is_set():
            self.hung.set()
            self.release.wait(WAIT_SECONDS)
        B, L = tokens.shape
        cache[0].update_and_fetch(mx.zeros((B, 1, L, 1)), mx.zeros((B, 1, L, 1)))
        logits = 10.0 * mx.eye(VOCAB)[(tokens + 1) % VOCAB]
        return logits[:, -1:] if last_only else logits


class Letters:
    def add_token(self, token_id: int) -> str:
        return chr(ord("a") + token_id)

    def finalize(self) -> str:
        return ""


def _request() -> EngineRequest:
    return EngineRequest(
        prompt_ids=(0,),
        sampling=SamplingParams(temperature=0.0),
        generation=GenerationConfig(context_size=64, max_tokens=40),
        detokenizer=Letters(),
    )


def test_abandon_ends_running_and_waiting_requests_while_the_thread_is_blocked():
    model = HangingModel()
    engine = Engine(model)
    model.hang.set()
    running, waiting = OutputQueue(), OutputQueue()
    engine.submit([_request()], running)
    assert model.hung.wait(WAIT_SECONDS)
    engine.submit([_request()], waiting)
    error = EngineUnavailableError("rank 2 exited with code -9")
    engine.abandon(error)
    for sink in (running, waiting):
        assert sink.get(timeout=WAIT_SECONDS).error is error
    assert engine.failure is error
    with pytest.raises(EngineClosedError):
        engine.submit([_request()], OutputQueue())
    model.release.set()


def _engine_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "mlxcel-engine"}


def test_abandon_ends_an_idle_engine_thread():
    before = _engine_threads()
    engine = Engine(HangingModel())
    (thread,) = _engine_threads() - before
    engine.abandon(EngineUnavailableError("rank 1 exited with code -9"))
    thread.join(WAIT_SECONDS)
    assert not thread.is_alive()
