"""An app serving the tiny text model and fake speech models, for the audio route tests."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass

from quart.datastructures import FileStorage
from werkzeug.datastructures import Headers

from mlxcel_core.engine import Engine
from mlxcel_server import ServerSettings, ServerState, ServingModel, create_app
from mlxcel_server.audio_models import ServingAudio
from mlxcel_server.audio_worker import AudioWorker


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Headers
    body: bytes

    def json(self):
        return json.loads(self.body)


class AudioClient:
    """Calls the app in-process; `request` for one call, `send` inside a running loop."""

    def __init__(self, app) -> None:
        self.app = app

    async def send(self, method: str, path: str, **kwargs) -> Reply:
        response = await self.app.test_client().open(path, method=method, **kwargs)
        return Reply(response.status_code, response.headers, await response.get_data())

    def post(self, path: str, **kwargs) -> Reply:
        return asyncio.run(self.send("POST", path, **kwargs))

    def get(self, path: str, **kwargs) -> Reply:
        return asyncio.run(self.send("GET", path, **kwargs))


def upload(data: bytes, filename: str = "clip.wav", **form: str) -> dict:
    """`AppClient.post` arguments for a multipart transcription request."""
    return {"files": {"file": FileStorage(io.BytesIO(data), filename=filename)}, "form": form}


class AudioApps:
    """Builds apps on the tiny text model with fake speech models; `close` stops them all."""

    def __init__(self, loaded) -> None:
        self._loaded = loaded
        self._states: list[ServerState] = []

    def make(self, *, stt=None, tts=None, max_waiting: int = 8, **settings):
        """(client, state) of an app serving `stt` and `tts`; both None serves no audio."""
        state = ServerState()
        engine = Engine(self._loaded.model)
        state.set_ready(ServingModel(self._loaded, engine, "tiny", 256))
        if stt is not None or tts is not None:
            worker = AudioWorker(max_waiting=max_waiting, retry_after_seconds=2)
            state.set_audio(ServingAudio(stt, tts, worker, created=1))
        self._states.append(state)
        return AudioClient(create_app(state, ServerSettings(**settings))), state

    def close(self) -> None:
        for state in self._states:
            state.close(timeout=10)
