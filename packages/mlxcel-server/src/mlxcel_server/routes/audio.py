"""The OpenAI audio endpoints: a 501 until an audio model can be served."""

from __future__ import annotations

from quart import Blueprint, Response, request

from mlxcel_server.errors import ApiError

_ENDPOINTS = ("speech", "transcriptions", "translations")


def make_blueprint() -> Blueprint:
    blueprint = Blueprint("audio", __name__)

    async def not_implemented() -> Response:
        raise ApiError(
            501,
            f"{request.path} needs an audio model, and no audio model is loaded: "
            "this server serves a text model only",
            code="not_implemented",
        )

    for name in _ENDPOINTS:
        blueprint.add_url_rule(f"/v1/audio/{name}", name, not_implemented, methods=["POST"])
        blueprint.add_url_rule(
            f"/audio/{name}", f"{name}_unversioned", not_implemented, methods=["POST"]
        )
    return blueprint
