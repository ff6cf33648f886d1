"""`mlxcel serve --disaggregate` on the real SmolLM2 when the prefill rank dies or hangs:
the request whose KV is in flight ends with an error naming rank 1 (at once for a killed
rank, after the stage timeout for a stopped one), the stream decoding beside it ends too,
later requests get 503, `/health` reports the degraded state, and the server still stops
cleanly."""

from __future__ import annotations

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from filler_text import filler
from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

# Two ranks loading and profiling the model on a shared 2-core machine.
STARTUP_SECONDS = 300
# Time for a reply to end once its fault is reported (the error event, a step).
MARGIN_SECONDS = 20
# About 2,000 tokens: several seconds of prefill on rank 1 here, in 4 chunks of 512.
LONG_PROMPT = filler(280)
# Seconds between sending the long prompt and killing rank 1: rank 1 has its job by then
# and is computing it.
KILL_AFTER_SECONDS = 1.0


@pytest.fixture(autouse=True)
def one_blas_thread(monkeypatch):
    # The ranks share the cores; one BLAS thread each keeps them from spinning on each other.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")


def _serve(smollm2_path, stage_timeout: int) -> LiveServer:
    return LiveServer(
        "-m", str(smollm2_path), "-c", "4096", "--disaggregate",
        "--stage-timeout", str(stage_timeout), startup_seconds=STARTUP_SECONDS,
    )  # fmt: skip


def _prefill_rank(server: LiveServer) -> psutil.Process:
    for child in psutil.Process(server.process.pid).children():
        if child.environ().get("MLX_RANK") == "1":
            return child
    raise AssertionError("no rank 1 among the server's children")


def _stream(
    server: LiveServer, prompt: str, max_tokens: int, read_seconds: float, on_token=None
) -> list[dict]:
    """Stream a greedy completion; call `on_token` at its first token; its SSE events
    (parsed) up to the end of the stream, `[DONE]` left out."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    events: list[dict] = []
    timeout = httpx.Timeout(10, read=read_seconds)
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=timeout) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
                if on_token is not None and len(events) == 1:
                    on_token()
    return events


def _tokens(events: list[dict]) -> int:
    return sum(1 for event in events if "choices" in event and event["choices"][0]["text"])


def _assert_degraded(server: LiveServer, reason: str) -> None:
    reply = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "The capital of France is", "max_tokens": 4},
        timeout=10,
    )
    assert reply.status_code == 503
    error = reply.json()["error"]
    assert error["type"] == "unavailable_error" and f"rank 1 {reason}" in error["message"]
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert health.json()["rank"] == 1 and reason in health.json()["reason"]


def test_rank_1_killed_mid_prefill_ends_the_requests_and_degrades_the_server(smollm2_path):
    server = _serve(smollm2_path, stage_timeout=60)
    try:
        with server.stderr_on_failure():
            rank1 = _prefill_rank(server)
            decoding = threading.Event()
            with ThreadPoolExecutor(2) as pool:
                stream = pool.submit(
                    _stream, server, "Once upon a time,", 400, MARGIN_SECONDS, decoding.set
                )
                assert decoding.wait(STARTUP_SECONDS)
                long_reply = pool.submit(_stream, server, LONG_PROMPT, 4, MARGIN_SECONDS)
                threading.Event().wait(KILL_AFTER_SECONDS)
                rank1.send_signal(signal.SIGKILL)
                long_events, stream_events = long_reply.result(), stream.result()
            # The long prompt's KV never came back: its only event is the error.
            assert _tokens(long_events) == 0
            assert "rank 1 exited with code -9" in long_events[-1]["error"]["message"]
            assert _tokens(stream_events) >= 1
            assert "rank 1 exited with code -9" in stream_events[-1]["error"]["message"]
            _assert_degraded(server, "exited with code -9")
            assert server.process.poll() is None
    finally:
        assert server.stop() == 0, server.stderr()


def test_rank_1_stopped_ends_the_request_after_the_stage_timeout(smollm2_path):
    stage_timeout = 10
    server = _serve(smollm2_path, stage_timeout)
    try:
        with server.stderr_on_failure():
            rank1 = _prefill_rank(server)
            rank1.send_signal(signal.SIGSTOP)
            # A prompt of one -ub chunk: its KV is due within one stage timeout.
            events = _stream(server, filler(20), 4, stage_timeout + MARGIN_SECONDS)
            assert _tokens(events) == 0
            message = events[-1]["error"]["message"]
            assert "rank 1 did not return a prompt's KV within" in message
            _assert_degraded(server, "did not return a prompt's KV")
            assert server.process.poll() is None
            assert rank1.status() == psutil.STATUS_STOPPED
    finally:
        assert server.stop() == 0, server.stderr()
    assert not rank1.is_running()
