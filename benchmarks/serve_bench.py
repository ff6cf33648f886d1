"""Concurrent streaming load on `mlxcel serve` against `mlx_lm.server`, same weights.

The servers run one after the other on the same mlx-lm folder (write one from a GGUF file
with `benchmarks/export_mlx_lm.py`; without `--model-dir` the embedded SmolLM2 is exported
to a temporary folder, dense float32 with `--float32`: the weights mlxcel computes with on
the CPU, so that mlx-lm runs the same arithmetic). Each server gets a warm-up wave of
max(concurrency) short requests, then for each level C of `--concurrency` a closed loop
(`benchmarks/load_gen.py`) keeps C streaming chat completions in flight (`temperature` 0,
`max_tokens` fixed) until `--requests-per-level` have been sent: by default C, one wave sent
at once; `2x` sends 2*C. Every request's messages start with a distinct number, unique
across levels and the warm-up, so no prompt cache helps either server; the same messages go
to every server. With `--varied-lengths`, every request's prompt also ends with its own
number of filler words, so prompt lengths vary as on a server in use (about 500 to 950
tokens with the random models' byte-level tokenizer, about 200 to 270 with SmolLM2's).

Per level the report gives aggregate output tokens/s (completion tokens over the wall time
from the first send to the last finish), TTFT p50/p95 (send to first content delta), ITL
p50/p95 (gaps between successive content deltas, so a delta carrying several tokens is one
gap; tokens are counted from the final `usage` chunk), the median per-stream decode tokens/s
(C = 1 is the single-stream figure), failed requests, and the server's resident memory (VmRSS
and its peak VmHWM from /proc) after the level, where KV memory growth shows; then the ratios
mlxcel / other for throughput and TTFT p95.

Servers, each started for up to max(concurrency) requests at once:
    mlxcel          `mlxcel serve -np C_max`, which preloads OpenBLAS where the system has it;
    mlx-lm          `python -m mlx_lm server --decode-concurrency C_max --prompt-concurrency
                    C_max`, as installed;
    mlx-lm+openblas the same with the OpenBLAS mlxcel preloads (from PyPI, else the
                    system's) in LD_PRELOAD, with the threads mlxcel gives it.

How mlx_lm.server 0.32.2 serves concurrent requests: a ThreadingHTTPServer thread per
connection hands each request to one generation thread, which runs mlx-lm's continuous
batching `BatchGenerator` whenever the model's caches can merge and the request has no seed,
images, draft model or `--kv-bits` (all true here): new requests join the running batch,
up to `--prompt-concurrency` (default 8) prompts are prefilled together and up to
`--decode-concurrency` (default 32) sequences decoded together; otherwise requests are
served one at a time. Both are set to C_max so a whole wave is prefilled in one batch and
decoded in one batch, its best case. It also keeps the KV caches of finished requests in an
LRU prompt cache (`--prompt-cache-size`, default 10 entries), which counts in its memory.

    uv run python benchmarks/serve_bench.py --concurrency 1,4,16 -n 64
    # the CPU serving target: both servers with OpenBLAS, same float32 weights, the ratios
    uv run python benchmarks/serve_bench.py --float32 --servers mlxcel,mlx-lm+openblas \\
        --concurrency 1,16 -n 64
    uv run python benchmarks/serve_bench.py --concurrency 1 --requests-per-level 5  # one stream
    uv run python benchmarks/serve_bench.py --model-dir /tmp/smollm2-mlx --servers mlx-lm \\
        --concurrency 4,16 --requests-per-level 2x
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from load_gen import (
    LevelStats,
    StreamTiming,
    messages_for,
    run_level,
    stream_chat,
    summarize_level,
)

from mlxcel.common.blas import preferred_blas
from mlxcel.common.blas_threads import with_process_threads

HOST = "127.0.0.1"
SERVERS = ("mlxcel", "mlx-lm", "mlx-lm+openblas")
STOP_SECONDS = 20.0
WARMUP_TOKENS = 16
LOG_TAIL_LINES = 40
MIB = 1 << 20


@dataclass(frozen=True)
class Memory:
    """A process's resident memory in bytes: now (VmRSS) and its peak so far (VmHWM)."""

    rss: int
    peak: int


@dataclass(frozen=True)
class ServerRun:
    """One server's levels, each with its memory after the level."""

    name: str
    warm_memory: Memory
    levels: tuple[tuple[LevelStats, Memory], ...]


def parse_concurrency(text: str) -> tuple[int, ...]:
    """`--concurrency`: comma-separated levels, e.g. "1,4,16".

    Raises:
        ValueError: a level is not an integer >= 1, or none is given.
    """
    try:
        levels = tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError as error:
        raise ValueError(f"--concurrency must be integers like 1,4,16, got '{text}'") from error
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency levels must be >= 1, got '{text}'")
    return levels


def requests_for_level(spec: str | None, concurrency: int) -> int:
    """Requests sent at one level: C if `spec` is None, N*C for "Nx", N for "N".

    Raises:
        ValueError: `spec` is malformed or gives fewer requests than `concurrency`.
    """
    if spec is None:
        return concurrency
    per_concurrency = spec.endswith("x")
    try:
        count = int(spec.removesuffix("x"))
    except ValueError as error:
        raise ValueError(
            f"--requests-per-level must be N or Nx (N times concurrency), got '{spec}'"
        ) from error
    requests = count * concurrency if per_concurrency else count
    if requests < concurrency:
        raise ValueError(
            f"--requests-per-level must give >= concurrency ({concurrency}) requests, got '{spec}'"
        )
    return requests


def parse_memory(status: str) -> Memory:
    """VmRSS and VmHWM from the text of /proc/<pid>/status (given in kB there)."""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return Memory(
        rss=int(fields["VmRSS"].split()[0]) * 1024, peak=int(fields["VmHWM"].split()[0]) * 1024
    )


def resident_memory(pid: int) -> Memory:
    return parse_memory(Path(f"/proc/{pid}/status").read_text())


def server_command(
    name: str, folder: Path, port: int, max_concurrency: int
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start server `name` on `folder`.

    Raises:
        ValueError: `name` is unknown, or OpenBLAS is missing for mlx-lm+openblas.
    """
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if name == "mlxcel":
        return [sys.executable, "-m", "mlxcel", "serve", "-m", str(folder), "--port", str(port),
                "-np", str(max_concurrency)], environ  # fmt: skip
    command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(folder),
               "--port", str(port), "--log-level", "WARNING",
               "--decode-concurrency", str(max_concurrency),
               "--prompt-concurrency", str(max_concurrency)]  # fmt: skip
    if name == "mlx-lm":
        return command, environ
    if name == "mlx-lm+openblas":
        # The OpenBLAS the mlxcel command preloads (from PyPI, else the system's), with
        # the threads it gives it.
        blas = preferred_blas(environ)
        if blas.library is None:
            raise ValueError(f"server 'mlx-lm+openblas' needs OpenBLAS; found {blas.source}")
        return command, with_process_threads(blas.environment(environ))
    raise ValueError(f"servers must be among {', '.join(SERVERS)}; got '{name}'")


@contextmanager
def running_server(
    command: list[str], environ: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a server in its own process group; stop it (SIGTERM, then SIGKILL) on exit."""
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, env=environ, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield process
        finally:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the server and its group have ended
        os.killpg(process.pid, signum)


def wait_until_ready(
    url: str,
    process: subprocess.Popen[bytes],
    timeout: float,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Send a one-token request until the server answers it (a 503 while it loads).

    `transport` replaces the network (tests pass an `httpx.MockTransport`).

    Raises:
        RuntimeError: the server exited, or refused the request with a 4xx status (the
            request itself is wrong for it, e.g. a model without a chat template).
        TimeoutError: it did not answer within `timeout` seconds.
    """

    async def probe() -> StreamTiming:
        timeouts = httpx.Timeout(timeout, connect=5.0)
        async with httpx.AsyncClient(timeout=timeouts, transport=transport) as client:
            return await stream_chat(client, url, messages_for(-1), 1)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        timing = asyncio.run(probe())
        if timing.ok:
            return
        if timing.status is not None and 400 <= timing.status < 500:
            raise RuntimeError(f"the server refused the readiness request: {timing.error}")
        time.sleep(0.5)
    raise TimeoutError(f"{url} was not ready within {timeout:.0f} s")


def bench_server(name: str, folder: Path, args: argparse.Namespace, log: Path) -> ServerRun:
    """Start server `name`, warm it up, run every concurrency level, stop it.

    Raises:
        RuntimeError: the server exited, at start or during a level.
        TimeoutError: it did not become ready within `--startup-timeout`.
    """
    url = f"http://{HOST}:{args.port}"
    max_concurrency = max(args.concurrency)
    command, environ = server_command(name, folder, args.port, max_concurrency)
    print(f"{name}: {' '.join(command)}", file=sys.stderr, flush=True)
    index = 0  # every request of this run gets its own messages

    def level(concurrency: int, num_requests: int, max_tokens: int) -> LevelStats:
        nonlocal index
        timings = asyncio.run(
            run_level(url, concurrency=concurrency, num_requests=num_requests,
                      max_tokens=max_tokens, first_index=index, timeout=args.request_timeout,
                      varied_lengths=args.varied_lengths)
        )  # fmt: skip
        index += num_requests
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        return summarize_level(concurrency, timings)

    check_port_free(args.port)
    with running_server(command, environ, log) as process:
        wait_until_ready(url, process, args.startup_timeout)
        warmup = level(max_concurrency, max_concurrency, min(args.max_tokens, WARMUP_TOKENS))
        if warmup.num_failed:
            failures = f"{warmup.num_failed} of {warmup.num_requests} warm-up requests failed"
            if warmup.num_failed == warmup.num_requests:
                raise RuntimeError(f"{failures}: {'; '.join(warmup.errors)}")
            print(f"{name}: {failures} ({'; '.join(warmup.errors)})", file=sys.stderr)
        warm_memory = resident_memory(process.pid)
        results = []
        for concurrency in args.concurrency:
            num_requests = requests_for_level(args.requests_per_level, concurrency)
            stats = level(concurrency, num_requests, args.max_tokens)
            results.append((stats, resident_memory(process.pid)))
            print(
                f"{name}: concurrency {concurrency} done, {stats.output_tps:.1f} tok/s"
                + (f", failures: {'; '.join(stats.errors)}" if stats.errors else ""),
                file=sys.stderr, flush=True,
            )  # fmt: skip
    return ServerRun(name, warm_memory, tuple(results))


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def format_run(run: ServerRun, max_tokens: int) -> str:
    """One server's table: a row per concurrency level."""
    bounds = [count for stats, _ in run.levels for count in stats.prompt_tokens or ()]
    prompt_tokens = "?"
    if bounds:
        least, most = min(bounds), max(bounds)
        prompt_tokens = str(least) if least == most else f"{least}-{most}"
    lines = [
        f"{run.name}: max_tokens {max_tokens}, temperature 0, {prompt_tokens} prompt tokens, "
        f"RSS after warm-up {run.warm_memory.rss / MIB:.0f} MiB",
        f"{'conc':>5}{'reqs':>6}{'fail':>6}{'out tok/s':>11}{'TTFT p50':>10}{'TTFT p95':>10}"
        f"{'ITL p50':>9}{'ITL p95':>9}{'stream tok/s':>14}{'RSS MiB':>9}{'peak MiB':>10}",
    ]
    for stats, memory in run.levels:
        stream_tps = "-" if math.isnan(stats.stream_tps_p50) else f"{stats.stream_tps_p50:.1f}"
        lines.append(
            f"{stats.concurrency:>5}{stats.num_requests:>6}{stats.num_failed:>6}"
            f"{stats.output_tps:>11.1f}{_ms(stats.ttft_p50):>10}{_ms(stats.ttft_p95):>10}"
            f"{_ms(stats.itl_p50):>9}{_ms(stats.itl_p95):>9}{stream_tps:>14}"
            f"{memory.rss / MIB:>9.0f}{memory.peak / MIB:>10.0f}"
        )
    return "\n".join(lines) + "\n(TTFT and ITL in ms)"


def format_ratios(ours: ServerRun, theirs: ServerRun) -> str:
    """mlxcel / other per level: throughput (higher is better), TTFT p95 (lower is better)."""
    lines = [f"{ours.name} / {theirs.name}: output tok/s ratio (>1 better), TTFT p95 ratio "
             "(<1 better)"]  # fmt: skip
    by_level = {stats.concurrency: stats for stats, _ in theirs.levels}
    for stats, _ in ours.levels:
        other = by_level.get(stats.concurrency)
        if other is None:
            continue
        throughput = stats.output_tps / other.output_tps if other.output_tps else math.nan
        ttft = stats.ttft_p95 / other.ttft_p95 if other.ttft_p95 else math.nan
        lines.append(
            f"  concurrency {stats.concurrency:>3}: throughput {throughput:.2f}x, "
            f"TTFT p95 {ttft:.2f}x"
        )
    return "\n".join(lines)


def format_report(runs: Sequence[ServerRun], max_tokens: int) -> str:
    sections = [format_run(run, max_tokens) for run in runs]
    ours = next((run for run in runs if run.name == "mlxcel"), None)
    if ours is not None:
        sections += [format_ratios(ours, run) for run in runs if run is not ours]
    return "\n\n".join(sections)


def free_port() -> int:
    """A TCP port on `HOST` that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def check_port_free(port: int) -> None:
    """Raises RuntimeError if something listens on `port`: it would answer in the server's place."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as error:
            raise RuntimeError(f"port {port} is in use: {error}") from error


def log_tail(log: Path, num_lines: int = LOG_TAIL_LINES) -> str:
    if not log.exists():
        return "(it wrote nothing)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-num_lines:])


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SIGTERM would otherwise end the process at once, leaving the server it started
    # running and its scratch folder behind; SystemExit runs the cleanup on the way out.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="mlx-lm folder to serve (default: export the embedded model)",
    )
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help="comma-separated, run in this order"
    )
    parser.add_argument(
        "--concurrency", default="1,4,16", help="comma-separated requests in flight per level"
    )
    parser.add_argument(
        "--requests-per-level",
        default=None,
        help="requests sent per level: N, or Nx for N*concurrency (default: one wave of C)",
    )
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument(
        "--port", type=int, default=None, help="the servers' port (default: a free one)"
    )
    parser.add_argument(
        "--varied-lengths",
        action="store_true",
        help="end each request with its own number of filler words (0-148), so prompt lengths vary",
    )
    parser.add_argument(
        "--float32",
        action="store_true",
        help="export the embedded model dense in float32 (without --model-dir)",
    )
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    args = parser.parse_args(argv)
    if args.max_tokens < 2:
        parser.error(f"-n/--max-tokens must be >= 2, got {args.max_tokens}")
    if args.float32 and args.model_dir is not None:
        parser.error("--float32 exports the embedded model; give it without --model-dir")
    try:
        args.concurrency = parse_concurrency(args.concurrency)
        for concurrency in args.concurrency:
            requests_for_level(args.requests_per_level, concurrency)
    except ValueError as error:
        parser.error(str(error))
    if args.port is None:
        args.port = free_port()
    names = [name.strip() for name in args.servers.split(",") if name.strip()]
    unknown = [name for name in names if name not in SERVERS]
    if unknown or not names:
        parser.error(f"--servers must be among {', '.join(SERVERS)}; got '{args.servers}'")
    runs = []
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as scratch:
        folder = args.model_dir
        if folder is None:
            from export_mlx_lm import export_gguf

            from mlxcel_models.default_model import default_model_path

            folder = export_gguf(
                default_model_path(), Path(scratch) / "model", float32=args.float32
            )
        for name in names:
            log = Path(scratch) / f"{name}.log"
            try:
                runs.append(bench_server(name, folder, args, log))
            except (RuntimeError, TimeoutError, ValueError) as error:
                print(
                    f"{name}: FAILED: {error}\n--- last {LOG_TAIL_LINES} lines of its output ---"
                    f"\n{log_tail(log)}\n---",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
    if runs:
        print(format_report(runs, args.max_tokens))
    return 0 if len(runs) == len(names) else 1


if __name__ == "__main__":
    raise SystemExit(main())
