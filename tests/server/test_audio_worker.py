"""The audio worker behind the endpoints: admission (503), cancellation, shutdown, metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from audio_app import AudioApps, upload
from audio_fakes import FakeSpeechToText, FakeVoice, wav_bytes
from quart.testing.utils import make_test_body_with_headers

from mlxcel_server.audio_totals import AudioTotals
from mlxcel_server.audio_worker import AudioWorker, AudioWorkerClosedError
from mlxcel_server.routes.audio import speech_work

WAIT_SECONDS = 10.0


@pytest.fixture
def apps(tiny_loaded):
    apps = AudioApps(tiny_loaded)
    yield apps
    apps.close()


async def _until(condition) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "the worker did not get there in time"
        await asyncio.sleep(0.01)


def test_a_full_audio_queue_answers_503_with_retry_after(apps):
    stt = FakeSpeechToText(gate=threading.Event())
    client, state = apps.make(stt=stt, tts=FakeVoice(), max_waiting=1)
    worker = state.audio.worker

    async def scenario():
        running = asyncio.create_task(
            client.send("POST", "/v1/audio/transcriptions", **upload(wav_bytes()))
        )
        await _until(lambda: worker.num_running == 1)
        waiting = asyncio.create_task(
            client.send("POST", "/v1/audio/transcriptions", **upload(wav_bytes()))
        )
        await _until(lambda: worker.num_waiting == 1)
        refused = await client.send("POST", "/v1/audio/speech", json={"input": "Hi."})
        stt.gate.set()
        return refused, await running, await waiting

    refused, first, second = asyncio.run(scenario())
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "2"
    assert "busy" in refused.json()["error"]["message"]
    assert (first.status, second.status) == (200, 200)


def test_a_client_that_leaves_cancels_its_queued_work(apps):
    stt = FakeSpeechToText(gate=threading.Event())
    client, state = apps.make(stt=stt)
    worker = state.audio.worker
    arguments = upload(wav_bytes())
    body, headers = make_test_body_with_headers(**arguments)

    async def scenario():
        running = asyncio.create_task(
            client.send("POST", "/v1/audio/transcriptions", **upload(wav_bytes()))
        )
        await _until(lambda: worker.num_running == 1)
        test_client = client.app.test_client()
        async with test_client.request(
            "/v1/audio/transcriptions", method="POST", headers=headers
        ) as connection:
            await connection.send(body)
            await connection.send_complete()
            await _until(lambda: worker.num_waiting == 1)
            await connection.disconnect()
        stt.gate.set()
        reply = await running
        await _until(lambda: worker.num_waiting == 0 and worker.num_running == 0)
        return reply

    assert asyncio.run(scenario()).status == 200
    assert stt.calls == 1


def test_shutdown_ends_waiting_work_and_refuses_new_work():
    gate = threading.Event()
    worker = AudioWorker(max_waiting=4, retry_after_seconds=1)

    def blocked():
        gate.wait(timeout=WAIT_SECONDS)
        yield "spoken"

    async def scenario():
        running = worker.submit(blocked)
        await _until(lambda: worker.num_running == 1)
        waiting = worker.submit(lambda: iter(["never"]))
        closing = asyncio.create_task(asyncio.to_thread(worker.shutdown, WAIT_SECONDS))
        await _until(lambda: worker.num_waiting == 0)
        gate.set()
        await closing
        with pytest.raises(AudioWorkerClosedError):
            await anext(waiting)
        with pytest.raises(AudioWorkerClosedError):
            worker.submit(lambda: iter([]))
        return [item async for item in running]

    assert asyncio.run(scenario()) == ["spoken"]


def _metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    return float(line.split()[-1])


def test_metrics_count_requests_and_audio_seconds(apps):
    client, _ = apps.make(stt=FakeSpeechToText(), tts=FakeVoice(), endpoint_metrics=True)
    client.post("/v1/audio/transcriptions", **upload(wav_bytes(1.5)))
    client.post("/v1/audio/transcriptions", **upload(wav_bytes(0.5)))
    client.post("/v1/audio/speech", json={"input": "One. Two.", "response_format": "wav"})
    text = client.get("/metrics").body.decode()
    requests = 'mlxcel:audio_requests_total{endpoint="%s"}'
    assert _metric(text, requests % "transcriptions") == 2
    assert _metric(text, requests % "speech") == 1
    assert _metric(text, requests % "translations") == 0
    seconds = 'mlxcel:audio_seconds_total{direction="%s"}'
    assert _metric(text, seconds % "transcribed") == pytest.approx(2.0)
    assert _metric(text, seconds % "synthesized") == pytest.approx(0.5, abs=0.01)
    processing = 'mlxcel:audio_processing_seconds_total{direction="transcribed"}'
    assert _metric(text, processing) > 0
    assert _metric(text, "mlxcel:audio_requests_deferred") == 0


def test_a_speech_stream_left_after_its_first_sentence_is_counted_as_far_as_it_went():
    audio = SimpleNamespace(totals=AudioTotals())
    voice = FakeVoice()
    sentences = speech_work(audio, voice, "One. Two. Three.", None, 1.0)()
    first = next(sentences)
    sentences.close()  # the client went away
    totals = audio.totals.snapshot()
    assert totals.requests == {"speech": 1}
    assert totals.audio_seconds["synthesized"] == pytest.approx(len(first) / voice.sample_rate)
