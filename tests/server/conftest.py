"""The app on the tiny GGUF model, driven by Quart's test client from synchronous tests."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass

import pytest
from reasoning_clients import scripted_engine, with_tokenizer
from replay_engine import TWO_CALLS, ScriptedEngine
from werkzeug.datastructures import Headers

from mlxcel_core.engine import Engine
from mlxcel_models.loading.gguf_file import read_gguf_header
from mlxcel_models.loading.loader import load_model
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app

from factories import HERMES_TEMPLATE
from reasoning_factories import THINKING_TEMPLATE


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Headers
    body: bytes

    def json(self):
        return json.loads(self.body)

    def events(self) -> list:
        """The `data:` payloads of an SSE body, `[DONE]` kept as the string."""
        blocks = self.body.decode().split("\n\n")
        payloads = [b.removeprefix("data: ") for b in blocks if b.startswith("data: ")]
        return [p if p == "[DONE]" else json.loads(p) for p in payloads]


class AppClient:
    """Calls the app in-process; each call runs on a fresh event loop."""

    def __init__(self, app) -> None:
        self.app = app

    def request(self, method: str, path: str, **kwargs) -> Reply:
        async def call() -> Reply:
            response = await self.app.test_client().open(path, method=method, **kwargs)
            return Reply(response.status_code, response.headers, await response.get_data())

        return asyncio.run(call())

    def post(self, path: str, body=None, **kwargs) -> Reply:
        if body is not None:
            kwargs["json"] = body
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs) -> Reply:
        return self.request("GET", path, **kwargs)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_gguf):
    return load_model(tiny_gguf)


@pytest.fixture
def make_client(tiny_loaded):
    states = []

    def make(context_size: int = 256, *, loaded=None, engine=None, **settings) -> AppClient:
        """An app on `loaded` (default: the tiny model) run by `engine` (default: a real one)."""
        loaded = loaded or tiny_loaded
        engine = engine or Engine(loaded.model)
        state = ServerState()
        state.set_ready(ServingModel(loaded, engine, "tiny", context_size))
        states.append(state)
        return AppClient(create_app(state, ServerSettings(**{"n_predict": 8, **settings})))

    yield make
    for state in states:
        state.close(timeout=10)


@pytest.fixture
def client(make_client) -> AppClient:
    return make_client()


@pytest.fixture
def loading_client() -> AppClient:
    """An app whose model has not finished loading."""
    return AppClient(create_app(ServerState(), ServerSettings()))


@pytest.fixture(scope="module")
def thinking_loaded(tiny_gguf, tiny_loaded):
    """The tiny model with a Qwen3-style `<think>` template and single-token markers."""
    return with_tokenizer(tiny_gguf, tiny_loaded, THINKING_TEMPLATE)


@pytest.fixture
def make_thinking_client(make_client, thinking_loaded):
    """An app on the thinking model whose engine replies `<think>Plan</think>OK`."""

    def make(**settings):
        engine = scripted_engine(thinking_loaded.tokenizer)
        return make_client(loaded=thinking_loaded, engine=engine, **settings)

    return make


@pytest.fixture
def make_replay_client(make_client, thinking_loaded):
    """An app on the thinking model whose engine replays `reply` in 7-character pieces,
    keeping the prompts it was given."""

    def make(reply: str, **settings) -> tuple:
        engine = ScriptedEngine(reply)
        return make_client(1024, loaded=thinking_loaded, engine=engine, **settings), engine

    return make


@pytest.fixture(scope="module")
def hermes_loaded(tiny_gguf, tiny_loaded):
    """The tiny model with a Hermes/Qwen-style tool-calling template."""
    metadata = {
        **read_gguf_header(tiny_gguf, arrays=True).metadata,
        "tokenizer.chat_template": HERMES_TEMPLATE,
    }
    return dataclasses.replace(tiny_loaded, tokenizer=Tokenizer.from_gguf_metadata(metadata))


@pytest.fixture
def make_tool_client(make_client, hermes_loaded):
    """An app on the Hermes model whose engine replays `reply` (default: two tool calls)."""

    def make(reply: str = TWO_CALLS):
        engine = ScriptedEngine(reply)
        return make_client(1024, loaded=hermes_loaded, engine=engine), engine

    return make
