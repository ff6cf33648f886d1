"""LoRA adapters over HTTP: `GET/POST /lora-adapters`, the per-request `lora` field (app test
client), and the `openai` client's `extra_body` against a live server, on the tiny float32
llama with two adapters."""

from __future__ import annotations

import httpx
import openai
import pytest

from mlxcel_core.engine import Engine
from mlxcel_models.attach_lora import apply_adapters
from mlxcel_models.loading.loader import load_model
from mlxcel_models.lora import AdapterSpec

from adapter_factories import lora_updates, write_mlx_lm_adapter, write_peft_adapter
from live_server import LiveServer

PROMPT = "hello"


@pytest.fixture(scope="module")
def adapter_paths(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("lora")
    first = write_mlx_lm_adapter(folder / "first", lora_updates(seed=1), 2.0)
    second = write_peft_adapter(folder / "second", lora_updates(seed=2), lora_alpha=16)
    return str(first), str(second)


@pytest.fixture
def adapter_client(make_client, tiny_safetensors, adapter_paths):
    def make(scales=(1.0, 0.0), *, fuse=False):
        specs = [
            AdapterSpec(path, scale) for path, scale in zip(adapter_paths, scales, strict=True)
        ]
        loaded = apply_adapters(load_model(tiny_safetensors), specs, fuse=fuse)
        engine = Engine(loaded.model, adapters=loaded.row_adapters)
        return make_client(loaded=loaded, engine=engine)

    return make


def complete(client, **fields) -> str:
    reply = client.post("/v1/completions", {"prompt": PROMPT, "temperature": 0, **fields})
    assert reply.status == 200, reply.body
    return reply.json()["choices"][0]["text"]


def test_get_lists_the_adapters_and_post_sets_their_scales(adapter_client, adapter_paths):
    client = adapter_client()
    listed = client.get("/lora-adapters").json()
    assert listed == [
        {"id": 0, "path": adapter_paths[0], "scale": 1.0},
        {"id": 1, "path": adapter_paths[1], "scale": 0.0},
    ]
    reply = client.post("/lora-adapters", [{"id": 1, "scale": 0.5}])
    assert reply.status == 200 and reply.json() == {"success": True}
    # As llama-server: an adapter left out of the list is set to 0.
    assert [a["scale"] for a in client.get("/lora-adapters").json()] == [0.0, 0.5]


@pytest.fixture(scope="module")
def base_loaded(tiny_safetensors):
    return load_model(tiny_safetensors)


def test_global_and_per_request_scales_change_the_output(make_client, adapter_client, base_loaded):
    base = complete(make_client(loaded=base_loaded))
    client = adapter_client()
    adapted = complete(client)
    assert adapted != base
    assert complete(client, lora=[{"id": 0, "scale": 0.0}]) == base
    assert complete(client, lora=[]) == base
    assert complete(client, lora=[{"id": 0, "scale": 1.0}]) == adapted
    other = complete(client, lora=[{"id": 1, "scale": 1.0}])
    assert other not in (base, adapted)
    assert client.post("/lora-adapters", []).status == 200
    assert complete(client) == base
    assert complete(client, lora=[{"id": 0, "scale": 1}]) == adapted
    chat = client.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "lora": [{"id": 1, "scale": 2.0}]},
    )
    assert chat.status == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([{"id": 2, "scale": 1.0}], "adapter id must be in [0, 1], got 2"),
        ([{"id": 0}], "[0].scale: Field required"),
        ({"id": 0, "scale": 1.0}, "must be a JSON array"),
    ],
)
def test_bad_scale_updates_are_400s(adapter_client, body, message):
    client = adapter_client()
    reply = client.post("/lora-adapters", body)
    assert reply.status == 400
    assert message in reply.json()["error"]["message"]
    completion = client.post("/v1/completions", {"prompt": PROMPT, "lora": body})
    assert completion.status == 400


def test_fused_adapters_refuse_scale_changes(adapter_client, make_client):
    unfused = complete(adapter_client((0.5, 1.0)))
    client = adapter_client((0.5, 1.0), fuse=True)
    assert complete(client) == unfused
    assert [a["scale"] for a in client.get("/lora-adapters").json()] == [0.5, 1.0]
    for reply in (
        client.post("/lora-adapters", [{"id": 0, "scale": 1.0}]),
        client.post("/v1/completions", {"prompt": PROMPT, "lora": [{"id": 0, "scale": 1.0}]}),
    ):
        assert reply.status == 400
        assert "fused into the weights" in reply.json()["error"]["message"]


def test_a_server_without_adapters_lists_none_and_refuses_the_field(client):
    assert client.get("/lora-adapters").json() == []
    reply = client.post("/v1/completions", {"prompt": PROMPT, "lora": [{"id": 0, "scale": 1}]})
    assert reply.status == 400 and reply.json()["error"]["param"] == "lora"


def test_openai_client_sends_lora_in_extra_body(tiny_safetensors, adapter_paths):
    first, _ = adapter_paths
    server = LiveServer(
        "-m", str(tiny_safetensors), "-a", "tiny", "-n", "8", "--lora-scaled", first, "0"
    )  # fmt: skip
    try:
        with server.stderr_on_failure():
            client = server.client()

            def complete_live(**extra) -> str:
                reply = client.completions.create(
                    model="tiny", prompt=PROMPT, temperature=0, max_tokens=8, **extra
                )
                return reply.choices[0].text

            base = complete_live()
            adapted = complete_live(extra_body={"lora": [{"id": 0, "scale": 1.0}]})
            assert adapted != base
            listed = httpx.get(server.url + "/lora-adapters", timeout=30).json()
            assert listed == [{"id": 0, "path": first, "scale": 0.0}]
            update = [{"id": 0, "scale": 1.0}]
            assert httpx.post(server.url + "/lora-adapters", json=update, timeout=30).json() == {
                "success": True
            }
            assert complete_live() == adapted
            assert complete_live(extra_body={"lora": []}) == base
            with pytest.raises(openai.BadRequestError, match="adapter id"):
                complete_live(extra_body={"lora": [{"id": 7, "scale": 1.0}]})
    finally:
        server.stop()
