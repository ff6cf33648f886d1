"""`mlxcel serve --disaggregate` on the real SmolLM2: a second request's prefill does not
pause the stream decoding beside it.

The prefill rank is stopped (SIGSTOP) before the second prompt is sent, so that prompt's
KV stays in flight for as long as the test wants, whatever the machine's speed: the first
stream must still run to its end meanwhile, which it cannot if the engine thread waits on
the link (as it did while MLX's throttle of tasks in flight held its evaluations behind a
waiting receive, ADR 0013). Once rank 1 resumes, the second prompt is answered."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from test_disagg_faults_serve import _prefill_rank, _stream, _tokens

from filler_text import filler
from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

# Two ranks loading and profiling the model on a shared 2-core machine.
STARTUP_SECONDS = 300
# The longest wait for one event of a stream that is not held back.
READ_SECONDS = 60
STREAM_TOKENS = 16
# About 150 tokens, one -ub chunk: its length does not matter while rank 1 is stopped.
SECOND_PROMPT = filler(20)


@pytest.fixture(autouse=True)
def one_blas_thread(monkeypatch):
    # The ranks share the cores; one BLAS thread each keeps them from spinning on each other.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")


def test_a_stream_runs_to_its_end_while_another_prompts_prefill_is_held(smollm2_path):
    # A deadline longer than the test, so the held prefill is not reported as a fault.
    server = LiveServer(
        "-m", str(smollm2_path), "-c", "1024", "--disaggregate", "--stage-timeout", "600",
        startup_seconds=STARTUP_SECONDS,
    )  # fmt: skip
    try:
        with server.stderr_on_failure():
            rank1 = _prefill_rank(server)
            decoding = threading.Event()
            with ThreadPoolExecutor(2) as pool:
                # Its own prompt is prefilled on rank 1 too, so rank 1 is stopped only
                # once the stream decodes.
                stream = pool.submit(
                    _stream, server, "Once upon a time,", STREAM_TOKENS, READ_SECONDS,
                    decoding.set,
                )  # fmt: skip
                assert decoding.wait(STARTUP_SECONDS)
                rank1.send_signal(signal.SIGSTOP)
                try:
                    second = pool.submit(_stream, server, SECOND_PROMPT, 1, 2 * READ_SECONDS)
                    stream_events = stream.result()
                    # The whole stream ended while the second prompt's KV could not come back.
                    assert rank1.status() == psutil.STATUS_STOPPED
                    assert not second.done()
                finally:
                    rank1.send_signal(signal.SIGCONT)
                second_events = second.result()
            assert _tokens(stream_events) == STREAM_TOKENS
            assert stream_events[-1]["choices"][0]["finish_reason"] == "length"
            assert _tokens(second_events) == 1
            assert all("error" not in event for event in stream_events + second_events)
    finally:
        assert server.stop() == 0, server.stderr()
