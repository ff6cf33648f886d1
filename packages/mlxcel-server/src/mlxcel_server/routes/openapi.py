"""GET /openapi.json: the OpenAPI document of this server."""

from __future__ import annotations

from quart import Blueprint, Response, jsonify

from mlxcel_server.openapi import make_openapi_document


def make_blueprint() -> Blueprint:
    blueprint = Blueprint("openapi", __name__)
    document = make_openapi_document()

    @blueprint.get("/openapi.json")
    async def openapi() -> Response:
        return jsonify(document)

    return blueprint
