"""llama-server's `GET /lora-adapters` and `POST /lora-adapters`: list and set global scales.

The scales set here apply to requests that arrive afterwards without a `lora` field;
requests already running keep theirs. Fused adapters (`--lora-fuse`) refuse changes.
"""

from __future__ import annotations

from quart import Blueprint, Response, jsonify

from mlxcel_models.lora import AdapterScaleError
from mlxcel_server.errors import invalid
from mlxcel_server.responses import LoraAdapterEntry
from mlxcel_server.schemas import LoraScales
from mlxcel_server.state import ServerState
from mlxcel_server.validation import parse_list_body


def make_blueprint(state: ServerState) -> Blueprint:
    blueprint = Blueprint("lora", __name__)

    @blueprint.get("/lora-adapters")
    async def list_adapters() -> Response:
        adapters = state.require_model().loaded.adapters
        if adapters is None:
            return jsonify([])
        entries = [
            LoraAdapterEntry(id=info.id, path=info.path, scale=scale).model_dump()
            for info, scale in zip(adapters.infos, adapters.global_scales, strict=True)
        ]
        return jsonify(entries)

    @blueprint.post("/lora-adapters")
    async def set_scales() -> Response:
        adapters = state.require_model().loaded.adapters
        body = await parse_list_body(LoraScales)
        if adapters is None:
            if body.root:
                raise invalid("this server has no LoRA adapters (start it with --lora)")
            return jsonify({"success": True})
        try:
            adapters.set_global_scales(
                adapters.scales_from({entry.id: entry.scale for entry in body.root})
            )
        except AdapterScaleError as error:
            raise invalid(str(error)) from error
        return jsonify({"success": True})

    return blueprint
