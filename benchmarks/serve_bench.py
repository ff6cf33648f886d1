"""One stream's TTFT and decode speed of `mlxcel serve` against `mlx_lm.server`, same weights.

The servers run one after the other on the same mlx-lm folder (write one from a GGUF file
with `benchmarks/export_mlx_lm.py`; without `--model-dir` the embedded SmolLM2 is exported
to a temporary folder). Each gets a warm-up request, then `-r` streaming chat completions
(`temperature` 0, `max_tokens` fixed). TTFT runs from sending the request to the first
content delta; decode speed is (completion tokens - 1) over the time from the first content
delta to the last. Every request's system message starts with its repetition number, so no
request reuses the previous one's prompt cache (mlx_lm.server keeps one); the same messages
go to every server.

Servers:
    mlxcel          `mlxcel serve`, which preloads OpenBLAS where the system has it;
    mlx-lm          `python -m mlx_lm server`, as installed;
    mlx-lm+openblas `python -m mlx_lm server` with the same OpenBLAS in LD_PRELOAD.

    uv run python benchmarks/serve_bench.py -r 5 -n 64
    uv run python benchmarks/serve_bench.py --model-dir /tmp/smollm2-mlx --servers mlxcel,mlx-lm
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"
HOST = "127.0.0.1"
STOP_SECONDS = 20.0
USER_MESSAGE = (
    "Here is the start of a story. The lighthouse keeper on the northern island had not seen "
    "a ship in forty days. Every evening she climbed the spiral stairs, trimmed the wick, and "
    "wrote one line in the logbook: 'No ships.' On the forty-first evening the lamp would not "
    "light, and from the dark water below came the sound of oars. Continue the story in "
    "detail, describing the visitors, the island, the weather and what the keeper decides."
)


@dataclass(frozen=True)
class StreamTiming:
    """One streamed completion: seconds to the first content delta, decode tokens/s, tokens."""

    ttft: float
    decode_tps: float
    completion_tokens: int
    prompt_tokens: int | None


@dataclass(frozen=True)
class ServerResult:
    name: str
    ttft: float
    decode_tps: float
    completion_tokens: tuple[int, ...]
    prompt_tokens: int | None


def messages_for(repetition: int) -> list[dict[str, str]]:
    """The chat messages of one repetition: a distinct system message, the fixed prompt."""
    return [
        {"role": "system", "content": f"Request {repetition}. You are a helpful storyteller."},
        {"role": "user", "content": USER_MESSAGE},
    ]


def server_command(name: str, folder: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start server `name` on `folder`."""
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if name == "mlxcel":
        mlxcel = Path(sys.executable).parent / "mlxcel"
        return [str(mlxcel), "serve", "-m", str(folder), "--port", str(port)], environ
    command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(folder),
               "--port", str(port), "--log-level", "WARNING"]  # fmt: skip
    if name == "mlx-lm":
        return command, environ
    if name == "mlx-lm+openblas":
        if not Path(OPENBLAS).exists():
            raise ValueError(f"server 'mlx-lm+openblas' needs {OPENBLAS}")
        return command, {**environ, "LD_PRELOAD": OPENBLAS}
    raise ValueError(f"servers must be among mlxcel, mlx-lm, mlx-lm+openblas; got '{name}'")


@contextmanager
def running_server(
    name: str, folder: Path, port: int, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a server in its own process group; stop it (SIGTERM, then SIGKILL) on exit."""
    command, environ = server_command(name, folder, port)
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, env=environ, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield process
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def stream_completion(
    client: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int
) -> StreamTiming:
    """Send one streaming chat completion and time its content deltas."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    deltas = 0
    usage = None
    first = last = 0.0
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data:"))
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                last = time.perf_counter()
                if deltas == 0:
                    first = last
                deltas += 1
    if deltas == 0:
        raise RuntimeError(f"{url} streamed no content")
    tokens = usage["completion_tokens"] if usage else deltas
    decode_tps = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    prompt_tokens = usage.get("prompt_tokens") if usage else None
    return StreamTiming(first - start, decode_tps, tokens, prompt_tokens)


def wait_until_ready(
    client: httpx.Client, url: str, process: subprocess.Popen[bytes], timeout: float
) -> None:
    """Send a one-token request until the server answers it (it may be loading).

    Raises:
        RuntimeError: the server exited.
        TimeoutError: it did not answer within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            stream_completion(client, url, messages_for(-1), 1)
            return
        except (httpx.TransportError, httpx.HTTPStatusError, RuntimeError):
            time.sleep(0.5)
    raise TimeoutError(f"{url} was not ready within {timeout:.0f} s")


def bench_server(name: str, folder: Path, args: argparse.Namespace, log: Path) -> ServerResult:
    url = f"http://{HOST}:{args.port}"
    timeout = httpx.Timeout(args.request_timeout, connect=5.0)
    with (
        running_server(name, folder, args.port, log) as process,
        httpx.Client(timeout=timeout) as client,
    ):
        wait_until_ready(client, url, process, args.startup_timeout)
        stream_completion(client, url, messages_for(0), args.max_tokens)  # warm-up
        runs = [
            stream_completion(client, url, messages_for(repetition), args.max_tokens)
            for repetition in range(1, args.repetitions + 1)
        ]
    return ServerResult(
        name,
        statistics.median(run.ttft for run in runs),
        statistics.median(run.decode_tps for run in runs),
        tuple(run.completion_tokens for run in runs),
        runs[0].prompt_tokens,
    )


def format_results(results: list[ServerResult], args: argparse.Namespace) -> str:
    lines = [
        f"max_tokens {args.max_tokens}, temperature 0, median of {args.repetitions} "
        "after a warm-up",
        f"{'server':<18}{'TTFT ms':>10}{'decode tok/s':>14}{'prompt tok':>12}  completion tokens",
    ]
    for result in results:
        lines.append(
            f"{result.name:<18}{result.ttft * 1000:>10.1f}{result.decode_tps:>14.1f}"
            f"{result.prompt_tokens or '?':>12}  {list(result.completion_tokens)}"
        )
    ours = next((result for result in results if result.name == "mlxcel"), None)
    for theirs in results:
        if ours is not None and theirs is not ours:
            lines.append(
                f"mlxcel vs {theirs.name}: TTFT {theirs.ttft / ours.ttft:.2f}x faster, "
                f"decode {ours.decode_tps / theirs.decode_tps:.2f}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="mlx-lm folder to serve (default: export the embedded model)",
    )
    parser.add_argument(
        "--servers",
        default="mlxcel,mlx-lm,mlx-lm+openblas",
        help="comma-separated, run in this order",
    )
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("-r", "--repetitions", type=int, default=5)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds")
    args = parser.parse_args(argv)
    if args.max_tokens < 2:
        parser.error(f"-n/--max-tokens must be >= 2, got {args.max_tokens}")
    if args.repetitions < 1:
        parser.error(f"-r/--repetitions must be >= 1, got {args.repetitions}")
    names = [name.strip() for name in args.servers.split(",") if name.strip()]
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as scratch:
        folder = args.model_dir
        if folder is None:
            from export_mlx_lm import export_gguf

            from mlxcel_models.default_model import default_model_path

            folder = export_gguf(default_model_path(), Path(scratch) / "model")
        results = []
        for name in names:
            log = Path(scratch) / f"{name}.log"
            try:
                results.append(bench_server(name, folder, args, log))
            except (httpx.HTTPError, RuntimeError, TimeoutError):
                server_log = log.read_text(errors="replace")
                print(f"--- {name} server log ---\n{server_log}", file=sys.stderr)
                raise
            print(f"{name}: done", file=sys.stderr, flush=True)
    print(format_results(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
