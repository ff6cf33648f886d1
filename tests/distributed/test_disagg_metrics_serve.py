"""`mlxcel serve --disaggregate --metrics` on the real SmolLM2: after two prompts `/metrics`
counts two remote prefills whose KV bytes are their blocks' real size, and once the
prefill rank is killed its gauge reads 0 and the pair is degraded."""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest

from live_server import LiveServer
from metric_samples import metric_samples

pytestmark = [pytest.mark.slow, pytest.mark.long]

# Two ranks loading the model on a shared 2-core machine.
STARTUP_SECONDS = 300
WAIT_SECONDS = 30
BLOCK_SIZE = 16
# SmolLM2-135M: 30 layers of 3 KV heads of 64, keys and values, float32 in the cache.
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4
# Shorter than a block each, so neither finds the other's KV in the prefix cache.
PROMPTS = ["The capital of France is", "Write a haiku about the sea"]


@pytest.fixture(autouse=True)
def one_blas_thread(monkeypatch):
    # The ranks share the cores; one BLAS thread each keeps them from spinning on each other.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")


def _samples(server: LiveServer) -> dict[str, float]:
    return metric_samples(httpx.get(server.url + "/metrics", timeout=10).text)


def _prefill_rank(server: LiveServer) -> psutil.Process:
    for child in psutil.Process(server.process.pid).children():
        if child.environ().get("MLX_RANK") == "1":
            return child
    raise AssertionError("no rank 1 among the server's children")


def test_metrics_count_the_remote_prefills_and_show_a_killed_prefill_rank(smollm2_path):
    server = LiveServer(
        "-m", str(smollm2_path), "-c", "1024", "--block-size", str(BLOCK_SIZE),
        "--disaggregate", "--metrics", startup_seconds=STARTUP_SECONDS,
    )  # fmt: skip
    try:
        with server.stderr_on_failure():
            kv_bytes = 0
            for prompt in PROMPTS:
                body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
                reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
                assert reply.status_code == 200
                # All but the last prompt token go to rank 1, in whole blocks.
                num_sent = reply.json()["usage"]["prompt_tokens"] - 1
                kv_bytes += -(-num_sent // BLOCK_SIZE) * BLOCK_SIZE * KV_BYTES_PER_TOKEN
            samples = _samples(server)
            assert samples['mlxcel:distributed_ranks{rank="1",role="prefill"}'] == 1
            assert samples["mlxcel:remote_prefills_total"] == len(PROMPTS)
            assert samples["mlxcel:remote_prefill_seconds_count"] == len(PROMPTS)
            assert samples["mlxcel:remote_prefill_compute_seconds_count"] == len(PROMPTS)
            assert samples["mlxcel:kv_transfer_bytes_total"] == kv_bytes

            _prefill_rank(server).send_signal(signal.SIGKILL)
            deadline = time.monotonic() + WAIT_SECONDS
            while _samples(server)["mlxcel:distributed_degraded"] == 0:
                assert time.monotonic() < deadline, "the killed rank 1 was not seen"
                time.sleep(0.2)
            samples = _samples(server)
            assert samples['mlxcel:distributed_ranks{rank="0",role="front"}'] == 1
            assert samples['mlxcel:distributed_ranks{rank="1",role="prefill"}'] == 0
    finally:
        assert server.stop() == 0, server.stderr()
