"""TTFT of a long prompt and ITL of a concurrent stream, with and without `--disaggregate`.

Starts `mlxcel serve` (one process, then `--disaggregate`) on the default model, streams a
reply, and after `--lead-tokens` of it sends a long prompt of about `--long-sentences`
sentences (one token answered). Prints, per server, the long prompt's time to its answer
(TTFT), the stream's median inter-token latency (ITL) before the long prompt was sent and
its median and longest ITL while it was being prefilled.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        uv run python benchmarks/disaggregate.py
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

SENTENCES = (
    "The library opens at nine.",
    "Rain is expected on Tuesday.",
    "The train was late again.",
    "Apples grow well in cool climates.",
    "The meeting moved to room four.",
    "A new bakery opened downtown.",
)
STREAM_PROMPT = "Once upon a time, in a small village,"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(flags: list[str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxcel", "serve", "--port", str(port), "--no-audio", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.kill()
    raise TimeoutError("the server did not become healthy")


def _measure(url: str, long_prompt: str, stream_tokens: int, lead_tokens: int) -> dict:
    arrivals: list[float] = []
    window: list[float] = []
    lead = threading.Event()

    def send_long() -> None:
        lead.wait()
        window.append(time.perf_counter())
        body = {"prompt": long_prompt, "max_tokens": 1, "temperature": 0}
        httpx.post(f"{url}/v1/completions", json=body, timeout=900).raise_for_status()
        window.append(time.perf_counter())

    sender = threading.Thread(target=send_long)
    sender.start()
    body = {"prompt": STREAM_PROMPT, "max_tokens": stream_tokens, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=900) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("text"):
                arrivals.append(time.perf_counter())
                if len(arrivals) == lead_tokens:
                    lead.set()
    lead.set()
    sender.join()
    sent, answered = window
    gaps = list(itertools.pairwise(arrivals))
    before = [b - a for a, b in gaps if b <= sent]
    during = [b - a for a, b in gaps if b > sent and a < answered]
    return {
        "ttft_s": answered - sent,
        "itl_before_ms": 1000 * statistics.median(before),
        "itl_during_median_ms": 1000 * statistics.median(during) if during else None,
        "itl_during_max_ms": 1000 * max(during) if during else None,
        "stream_outlasted_prefill": arrivals[-1] > answered,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="the model (default: the embedded one)")
    parser.add_argument("--long-sentences", type=int, default=200)
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--lead-tokens", type=int, default=8)
    args = parser.parse_args()
    long_prompt = " ".join(SENTENCES[i % len(SENTENCES)] for i in range(args.long_sentences))
    flags = ["-c", "2048", "-np", "2"] + ([] if args.model is None else ["-m", args.model])
    for name, extra in (("one process", []), ("--disaggregate", ["--disaggregate"])):
        process, url = _start([*flags, *extra])
        try:
            result = _measure(url, long_prompt, args.stream_tokens, args.lead_tokens)
        finally:
            process.terminate()
            process.wait(60)
        print(name, json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
