"""llama-server's `GET /props` and `GET /slots`: one slot per sequence the engine runs at once."""

from __future__ import annotations

from quart import Blueprint, Response, jsonify

from mlxcel_server.audio_models import ServingAudio
from mlxcel_server.errors import ApiError
from mlxcel_server.settings import ServerSettings
from mlxcel_server.state import ServerState, ServingModel
from mlxcel_server.version import server_version


def default_params(settings: ServerSettings) -> dict:
    """The sampling and length defaults a request gets, in llama-server's slot `params` names."""
    sampling = settings.sampling
    return {
        "n_predict": settings.n_predict,
        "seed": -1 if sampling.seed is None else sampling.seed,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "typical_p": sampling.typical_p,
        "top_n_sigma": sampling.top_n_sigma,
        "xtc_probability": sampling.xtc_probability,
        "xtc_threshold": sampling.xtc_threshold,
        "repeat_last_n": sampling.repeat_last_n,
        "repeat_penalty": sampling.repeat_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "dry_multiplier": sampling.dry_multiplier,
        "dry_base": sampling.dry_base,
        "dry_allowed_length": sampling.dry_allowed_length,
        "dry_penalty_last_n": sampling.dry_penalty_last_n,
        "dry_sequence_breakers": list(sampling.dry_sequence_breakers),
        "samplers": [stage.value for stage in sampling.samplers],
    }


def _idle_slot(model: ServingModel, slot: int) -> dict:
    return {
        "id": slot,
        "n_ctx": model.context_size,
        "speculative": model.engine.config.speculative is not None,
        "is_processing": False,
    }


def _slots(model: ServingModel) -> list[dict]:
    """Every slot; a busy one names its task and counts its tokens as llama-server does."""
    slots = [_idle_slot(model, i) for i in range(model.engine.config.scheduler.max_num_seqs)]
    for state in model.engine.stats.slots:
        slots[state.slot].update(
            is_processing=True,
            id_task=state.request_id,
            index=state.index,
            n_prompt_tokens=state.num_prompt_tokens,
            n_prompt_tokens_cache=state.num_cached_tokens,
            n_decoded=state.num_generated,
        )
    return slots


def _takes_images(model: ServingModel, settings: ServerSettings) -> bool:
    """Whether chat requests may hold images: a vision model, and a server that reads them."""
    return model.loaded.image_prompter is not None and settings.image_decoder is not None


def _speech_models(audio: ServingAudio | None) -> dict:
    """The names of the models behind `/v1/audio/transcriptions` (`stt`) and
    `/v1/audio/speech` (`tts`); None where the server has none."""
    stt = None if audio is None or audio.stt is None else audio.stt.name
    tts = None if audio is None or audio.tts is None else audio.tts.name
    return {"stt": stt, "tts": tts}


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("props", __name__)

    @blueprint.get("/props")
    async def props() -> Response:
        model = state.require_model()
        return jsonify(
            {
                "default_generation_settings": {
                    **_idle_slot(model, 0),
                    "params": default_params(settings),
                },
                "total_slots": model.engine.config.scheduler.max_num_seqs,
                "model_alias": model.model_id,
                "model_path": str(model.loaded.source.path),
                "chat_template": model.loaded.tokenizer.chat_template or "",
                # `audio` is llama-server's audio input to the model; the speech
                # endpoints' models are named in `speech_models`.
                "modalities": {"vision": _takes_images(model, settings), "audio": False},
                "speech_models": _speech_models(state.audio),
                "endpoint_slots": settings.endpoint_slots,
                "endpoint_props": settings.endpoint_props,
                "endpoint_metrics": settings.endpoint_metrics,
                "build_info": f"mlxcel-server {server_version()}",
            }
        )

    @blueprint.post("/props")
    async def change_props() -> Response:
        if not settings.endpoint_props:
            message = (
                "This server does not support changing global properties. Start it with `--props`"
            )
        else:
            message = "mlxcel does not support changing global properties; restart with new flags"
        raise ApiError(501, message, code="not_supported")

    @blueprint.get("/slots")
    async def slots() -> Response:
        if not settings.endpoint_slots:
            raise ApiError(
                501,
                "This server does not support slots endpoint. Start it with `--slots`",
                code="not_supported",
            )
        return jsonify(_slots(state.require_model()))

    return blueprint
