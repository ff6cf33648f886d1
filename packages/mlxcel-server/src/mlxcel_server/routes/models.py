"""`GET /health` and `GET /v1/models` (and `/models`): the text model and any speech models."""

from __future__ import annotations

from quart import Blueprint, Response, jsonify

from mlxcel_server.errors import ApiError
from mlxcel_server.state import ServerState


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

    @blueprint.get("/v1/models")
    @blueprint.get("/models")
    async def models() -> Response:
        model = state.require_model()
        config = model.loaded.config
        entry = {
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
        audio = state.audio
        speech = (
            []
            if audio is None
            else [
                {"id": name, "object": "model", "created": audio.created, "owned_by": "mlxcel"}
                for name in audio.model_names
            ]
        )
        return jsonify({"object": "list", "data": [entry, *speech]})

    return blueprint
