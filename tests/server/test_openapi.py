"""The OpenAPI document at /openapi.json: it covers every route, and a schemathesis run over
it against a live server finds no server error."""

from __future__ import annotations

import re

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from live_server import LiveServer


def _documented_path(rule: str) -> str:
    # `<path:model_id>` is `{model_id}`.
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule)


def test_document_lists_every_route(client):
    reply = client.get("/openapi.json")
    assert reply.status == 200
    document = reply.json()
    assert document["openapi"].startswith("3.1")
    routes = {
        (_documented_path(rule.rule), method.lower())
        for rule in client.app.url_map.iter_rules()
        # The chat page's files are a web page, not API operations.
        if rule.endpoint != "static" and not rule.endpoint.startswith("webui.")
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {(path, method) for path, entry in document["paths"].items() for method in entry}
    assert routes == documented
    schema = schemathesis.openapi.from_dict(document)
    assert len(list(schema.get_all_operations())) == len(routes)


def test_document_is_behind_the_api_key(make_client):
    client = make_client(api_keys=("secret",))
    assert client.get("/openapi.json").status == 401
    assert client.get("/openapi.json", headers={"Authorization": "Bearer secret"}).status == 200


# Routes that always answer 501 (no audio model; properties fixed at startup): nothing to fuzz.
_NOT_IMPLEMENTED = frozenset(
    {"POST /props"}
    | {f"POST {prefix}/audio/{name}" for prefix in ("", "/v1")
       for name in ("speech", "transcriptions", "translations")}
)  # fmt: skip


def test_schemathesis_finds_no_server_error(tiny_gguf):
    # A small context bounds every generation, whatever max_tokens the run sends.
    server = LiveServer("-m", str(tiny_gguf), "-c", "64", "-n", "4", "-a", "tiny", "--metrics",
                        "--slots")  # fmt: skip
    try:
        schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
        checked, statuses = [], []
        for result in schema.get_all_operations():
            operation = result.ok()
            if operation.label in _NOT_IMPLEMENTED:
                continue

            @given(case=operation.as_strategy())
            @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
            def call(case) -> None:
                response = case.call_and_validate(checks=[not_a_server_error])
                statuses.append(response.status_code)

            call()
            checked.append(operation.label)
    finally:
        server.stop()
    assert "POST /v1/chat/completions" in checked and "POST /v1/responses" in checked
    assert 200 in statuses, "no call got past validation"
