"""The long-lived objects the handlers use: the loaded model and its engine."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.registry import Collector

from mlxcel_core.engine import Engine, EngineUnavailableError
from mlxcel_models.loaded import LoadedModel
from mlxcel_server.audio_models import ServingAudio
from mlxcel_server.errors import ApiError
from mlxcel_server.totals import GenerationTotals


@dataclass(frozen=True)
class ServingModel:
    """A loaded model with the engine that runs it.

    Attributes:
        loaded: the model, tokenizer and configuration.
        engine: the engine generating with `loaded.model`.
        model_id: the name replies carry and `/v1/models` lists (the alias, else the
            model's file or folder name). Requests are served whatever `model` they name,
            as llama-server serves its one model: clients with a fixed name work.
        context_size: the context window requests get (tokens).
        created: Unix time (seconds) the model became ready, reported by `/v1/models`.
        totals: tokens and time of the choices finished so far (for `/metrics`).
    """

    loaded: LoadedModel
    engine: Engine
    model_id: str
    context_size: int
    created: int = field(default_factory=lambda: int(time.time()))
    totals: GenerationTotals = field(default_factory=GenerationTotals, compare=False)


@dataclass(frozen=True)
class Degradation:
    """Why the server can no longer generate although it still answers (a rank of a
    multi-process model is gone).

    Attributes:
        message: one line for clients.
        detail: more fields for `/health` (e.g. the rank and the reason).
    """

    message: str
    detail: Mapping[str, object] = field(default_factory=dict)


class ServerState:
    """Holds the serving model once loading is done; handlers answer 503 before that,
    and after the server is degraded."""

    def __init__(self) -> None:
        self._model: ServingModel | None = None
        self._audio: ServingAudio | None = None
        self._degradation: Degradation | None = None
        self._collectors: list[Collector] = []

    @property
    def ready(self) -> bool:
        return self._model is not None

    @property
    def serving_model(self) -> ServingModel | None:
        """The serving model, or None while loading."""
        return self._model

    def set_ready(self, model: ServingModel) -> None:
        """Start serving `model`."""
        self._model = model

    @property
    def audio(self) -> ServingAudio | None:
        """The speech models, or None while loading or when none are served."""
        return self._audio

    def set_audio(self, audio: ServingAudio) -> None:
        """Start serving the speech models in `audio`."""
        self._audio = audio

    @property
    def degradation(self) -> Degradation | None:
        """Why the server cannot generate any more, or None while it can."""
        return self._degradation

    def degrade(self, degradation: Degradation) -> None:
        """From now on answer generation requests with 503 and `degradation`'s message;
        the requests in flight end with that error at once (the engine is abandoned: its
        thread may be blocked for good, see `Engine.abandon`)."""
        self._degradation = degradation
        if self._model is not None:
            self._model.engine.abandon(EngineUnavailableError(degradation.message))

    @property
    def collectors(self) -> tuple[Collector, ...]:
        """Metrics collectors added to `/metrics` beside the server's own."""
        return tuple(self._collectors)

    def add_collector(self, collector: Collector) -> None:
        """Report `collector`'s metrics in `/metrics` too."""
        self._collectors.append(collector)

    def require_model(self) -> ServingModel:
        """The serving model.

        Raises:
            ApiError: 503 while the model is loading, or once the server is degraded.
        """
        if self._model is None:
            raise ApiError(503, "the model is loading; retry shortly", headers={"Retry-After": "1"})
        if self._degradation is not None:
            raise ApiError(503, self._degradation.message)
        return self._model

    def close(self, timeout: float | None = None) -> None:
        """Shut the engine and the audio worker down (ending in-flight requests) and join
        their threads; an engine abandoned on degradation is not waited for."""
        if self._model is not None and self._degradation is None:
            self._model.engine.shutdown(timeout)
        if self._audio is not None:
            self._audio.worker.shutdown(timeout)
