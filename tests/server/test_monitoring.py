"""`/metrics`, `/props`, `/slots` and the audio placeholders, in-process on the tiny model."""

import pytest

from mlxcel_server.routes.metrics import LlamaServerCollector
from mlxcel_server.state import ServerState

COMPLETE = {"prompt": "hello", "max_tokens": 3, "temperature": 0}


def samples(text: str) -> dict[str, float]:
    """`name value` lines of a Prometheus text body."""
    lines = [line.split(" ") for line in text.splitlines() if line and not line.startswith("#")]
    return {name: float(value) for name, value in lines}


def test_metrics_counters_move_after_a_request(make_client):
    client = make_client(endpoint_metrics=True)
    before = client.get("/metrics")
    assert before.status == 200
    assert before.headers["Content-Type"].startswith("text/plain")
    start = samples(before.body.decode())
    assert start["llamacpp:prompt_tokens_total"] == 0
    assert start["llamacpp:requests_processing"] == start["llamacpp:requests_deferred"] == 0
    usage = client.post("/v1/completions", COMPLETE).json()["usage"]
    after = samples(client.get("/metrics").body.decode())
    assert after["llamacpp:prompt_tokens_total"] == usage["prompt_tokens"]
    assert after["llamacpp:tokens_predicted_total"] == usage["completion_tokens"] == 3
    assert after["llamacpp:prompt_seconds_total"] > 0
    assert after["llamacpp:prompt_tokens_seconds"] > 0
    assert after["llamacpp:predicted_tokens_seconds"] > 0
    # The throughput gauges cover the work since the previous scrape: none now.
    again = samples(client.get("/metrics").body.decode())
    assert again["llamacpp:prompt_tokens_seconds"] == 0
    assert again["llamacpp:prompt_tokens_total"] == usage["prompt_tokens"]


def test_metrics_and_slots_are_501_unless_enabled(client):
    for path, flag in (("/metrics", "--metrics"), ("/slots", "--slots")):
        reply = client.get(path)
        assert reply.status == 501
        error = reply.json()["error"]
        assert error["type"] == "not_supported_error" and flag in error["message"]


def test_metrics_while_loading_are_zero():
    collected = {m.name: m.samples[0].value for m in LlamaServerCollector(ServerState()).collect()}
    assert collected["llamacpp:prompt_tokens"] == 0
    assert collected["llamacpp:requests_deferred"] == 0


def test_props_report_the_model_and_defaults(make_client):
    body = make_client(endpoint_metrics=True).get("/props").json()
    settings = body["default_generation_settings"]
    assert settings["n_ctx"] == 256 and settings["is_processing"] is False
    assert settings["params"]["n_predict"] == 8
    assert settings["params"]["temperature"] == 0.8
    assert settings["params"]["samplers"][0] == "penalties"
    assert body["total_slots"] == 1 and body["model_alias"] == "tiny"
    assert body["model_path"].endswith(".gguf")
    assert body["endpoint_metrics"] is True and body["endpoint_slots"] is False
    assert body["build_info"].startswith("mlxcel-server ")


@pytest.mark.parametrize(("enabled", "text"), [(False, "--props"), (True, "restart")])
def test_props_changes_are_refused(make_client, enabled, text):
    reply = make_client(endpoint_props=enabled).post("/props", {"n_predict": 4})
    assert reply.status == 501 and text in reply.json()["error"]["message"]


def test_slots_show_the_one_slot(make_client):
    (slot,) = make_client(endpoint_slots=True).get("/slots").json()
    assert slot == {"id": 0, "n_ctx": 256, "speculative": False, "is_processing": False}


@pytest.mark.parametrize("prefix", ["/v1/audio", "/audio"])
@pytest.mark.parametrize("name", ["speech", "transcriptions", "translations"])
def test_audio_endpoints_are_structured_501s(client, prefix, name):
    reply = client.post(f"{prefix}/{name}", {"model": "tts-1", "input": "hi"})
    assert reply.status == 501
    error = reply.json()["error"]
    assert error["code"] == "not_implemented" and "no audio model is loaded" in error["message"]
