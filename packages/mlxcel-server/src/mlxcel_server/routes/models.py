"""`GET /health`, `GET /v1/models` and `GET /v1/models/{id}` (and unversioned): the text
model and any speech models."""

from __future__ import annotations

from quart import Blueprint, Response, jsonify

from mlxcel_server.audio_models import STT_ALIASES, TTS_ALIASES, answers_to
from mlxcel_server.errors import ApiError
from mlxcel_server.state import ServerState, ServingModel


def _text_entry(model: ServingModel) -> dict:
    config = model.loaded.config
    return {
        "id": model.model_id,
        "object": "model",
        "created": model.created,
        "owned_by": "mlxcel",
        "meta": {
            "n_ctx_train": config.context_length,
            "n_ctx": model.context_size,
            "n_vocab": config.vocab_size,
            "n_params": config.num_parameters,
            "size": config.weight_bytes,
        },
    }


def make_blueprint(state: ServerState) -> Blueprint:
    blueprint = Blueprint("models", __name__)

    @blueprint.get("/health")
    async def health() -> Response | tuple[Response, int]:
        model = state.serving_model
        if model is None:
            raise ApiError(503, "the model is loading", headers={"Retry-After": "1"})
        degradation = state.degradation
        if degradation is not None:
            body = {"status": "degraded", "message": degradation.message, **degradation.detail}
            return jsonify(body), 503
        if model.engine.failure is not None:
            raise ApiError(503, "the engine stopped after repeated failures; restart the server")
        audio = state.audio
        if audio is None:
            return jsonify({"status": "ok"})
        return jsonify({"status": "ok", "audio_models": list(audio.model_names)})

    def speech_entries(name: str | None = None) -> list[dict]:
        """The speech models' entries; with `name`, only the one it names (its own name or
        OpenAI's, as the speech routes take them)."""
        audio = state.audio
        if audio is None:
            return []
        served = ((audio.stt, STT_ALIASES), (audio.tts, TTS_ALIASES))
        return [
            {"id": model.name, "object": "model", "created": audio.created, "owned_by": "mlxcel"}
            for model, aliases in served
            if model is not None and (name is None or answers_to(model, aliases, name))
        ]

    @blueprint.get("/v1/models")
    @blueprint.get("/models")
    async def models() -> Response:
        entry = _text_entry(state.require_model())
        return jsonify({"object": "list", "data": [entry, *speech_entries()]})

    @blueprint.get("/v1/models/<path:model_id>")
    @blueprint.get("/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        """One entry of `/v1/models`: the speech model `model_id` names, else the text model,
        which serves any other name (ADR 0033), under its own id."""
        text = _text_entry(state.require_model())
        return jsonify(next(iter(speech_entries(model_id)), text))

    return blueprint
