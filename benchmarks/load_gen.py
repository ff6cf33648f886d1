"""A closed-loop load generator: concurrent streaming chat completions, timed per content delta.

`run_level` keeps `concurrency` streaming chat completions in flight (one asyncio task per
slot, each sending its next request as soon as its previous one ends) until `num_requests`
have been sent; with `num_requests == concurrency` that is one wave sent at once.
`summarize_level` turns the timings into one row of the report:

- output tokens/s: completion tokens of all successful requests over the wall time from the
  first send to the last finish;
- TTFT: from sending a request to its first content delta;
- ITL (inter-token latency): the gaps between successive content deltas of one request,
  pooled over all requests. A server may put several tokens in one delta (a partial UTF-8
  character held back, or a server that flushes in batches); such a delta shows as one longer
  gap, so ITL is a per-delta figure. Token counts come from the final `usage` chunk
  (`stream_options: {"include_usage": true}`), never from counting deltas.

Each request's messages start with its own index (`messages_for`), so no two requests share
more than the chat template's opening tokens and a leading digit: neither server's prefix cache
can reuse one request's prefill for another. With `varied_lengths`, each request also ends
with its own number of filler words, as prompts of many lengths reach a real server: any
149 consecutive requests add 0 to 148 words " ox" each, a different count for each (up to
about 450 tokens more with a byte-level tokenizer, about 150 with SmolLM2's). Their prompt
lengths mostly differ; the index's own digits can make two of them equal.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx

# How much of an error reply's body a failed timing keeps.
ERROR_BODY_CHARS = 300
# Filler words a request with varied length appends: (index * FILLER_STEP) % FILLER_COUNTS
# of them, distinct for any FILLER_COUNTS consecutive indices (the step is invertible
# modulo the prime count).
FILLER_COUNTS = 149
FILLER_STEP = 37
FILLER_WORD = "ox"
USER_MESSAGE = (
    "Here is the start of a story. The lighthouse keeper on the northern island had not seen "
    "a ship in forty days. Every evening she climbed the spiral stairs, trimmed the wick, and "
    "wrote one line in the logbook: 'No ships.' On the forty-first evening the lamp would not "
    "light, and from the dark water below came the sound of oars. Continue the story in "
    "detail, describing the visitors, the island, the weather and what the keeper decides."
)


@dataclass(frozen=True)
class StreamTiming:
    """One streamed chat completion; times are `time.perf_counter` seconds.

    Attributes:
        sent: when the request was sent.
        finished: when its stream ended, or it failed.
        deltas: when each content delta arrived, in order.
        completion_tokens: from the final `usage` chunk; the number of deltas if none came.
        prompt_tokens: from the final `usage` chunk; None if none came.
        error: why the request failed; None if it succeeded.
        status: the HTTP status of a reply refused with an error status; None otherwise.
    """

    sent: float
    finished: float
    deltas: tuple[float, ...]
    completion_tokens: int
    prompt_tokens: int | None
    error: str | None = None
    status: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float:
        """Seconds from sending to the first content delta."""
        return self.deltas[0] - self.sent

    @property
    def decode_tps(self) -> float:
        """Tokens/s after the first: (completion tokens - 1) over first to last delta."""
        span = self.deltas[-1] - self.deltas[0]
        return (self.completion_tokens - 1) / span if span > 0 else 0.0


@dataclass(frozen=True)
class LevelStats:
    """One concurrency level of one server. Times in seconds, NaN where no request succeeded."""

    concurrency: int
    num_requests: int
    num_failed: int
    wall: float
    completion_tokens: int
    output_tps: float
    ttft_p50: float
    ttft_p95: float
    itl_p50: float
    itl_p95: float
    stream_tps_p50: float
    prompt_tokens: tuple[int, int] | None
    """The fewest and most prompt tokens of the successful requests; None if none succeeded."""
    errors: tuple[str, ...] = ()
    """The distinct reasons the failed requests failed, in order of first occurrence."""


def messages_for(index: int, *, varied_length: bool = False) -> list[dict[str, str]]:
    """The chat messages of request `index`: a system message led by the index, a fixed
    prompt, and with `varied_length` the index's own number of filler words after it."""
    user_message = USER_MESSAGE
    if varied_length:
        count = index * FILLER_STEP % FILLER_COUNTS
        user_message += " Ignore these words:" + f" {FILLER_WORD}" * count
    return [
        {"role": "system", "content": f"{index}. You are a helpful storyteller."},
        {"role": "user", "content": user_message},
    ]


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile of `values`, interpolating linearly between closest ranks.

    The same rule as `numpy.percentile`'s default (Hyndman & Fan 1996, definition 7).

    Raises:
        ValueError: `values` is empty or `q` is outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def inter_token_gaps(deltas: Sequence[float]) -> list[float]:
    """Seconds between successive content deltas of one stream (one fewer than the deltas)."""
    return [later - earlier for earlier, later in itertools.pairwise(deltas)]


def _percentile_or_nan(values: Sequence[float], q: float) -> float:
    return percentile(values, q) if values else math.nan


def summarize_level(concurrency: int, timings: Sequence[StreamTiming]) -> LevelStats:
    """The report row of one level's timings (failed requests count in the wall time only).

    Raises:
        ValueError: `timings` is empty.
    """
    if not timings:
        raise ValueError("summarize_level needs at least one timing")
    done = [timing for timing in timings if timing.ok]
    wall = max(timing.finished for timing in timings) - min(timing.sent for timing in timings)
    completion_tokens = sum(timing.completion_tokens for timing in done)
    ttfts = [timing.ttft for timing in done]
    gaps = [gap for timing in done for gap in inter_token_gaps(timing.deltas)]
    return LevelStats(
        concurrency=concurrency,
        num_requests=len(timings),
        num_failed=len(timings) - len(done),
        wall=wall,
        completion_tokens=completion_tokens,
        output_tps=completion_tokens / wall if wall > 0 else 0.0,
        ttft_p50=_percentile_or_nan(ttfts, 50),
        ttft_p95=_percentile_or_nan(ttfts, 95),
        itl_p50=_percentile_or_nan(gaps, 50),
        itl_p95=_percentile_or_nan(gaps, 95),
        stream_tps_p50=statistics.median(t.decode_tps for t in done) if done else math.nan,
        prompt_tokens=_least_and_most(t.prompt_tokens for t in done),
        errors=tuple(dict.fromkeys(t.error for t in timings if t.error is not None)),
    )


def _least_and_most(counts: Iterable[int | None]) -> tuple[int, int] | None:
    """The smallest and largest of the counts known; None if none is."""
    known = [count for count in counts if count is not None]
    return (min(known), max(known)) if known else None


async def stream_chat(
    client: httpx.AsyncClient, url: str, messages: list[dict[str, str]], max_tokens: int
) -> StreamTiming:
    """Send one streaming chat completion (`temperature` 0) and time its content deltas.

    A transport error, an HTTP error status, an unreadable or error event, or a stream without
    content makes a failed timing (its `error` set) rather than an exception.
    """
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    deltas: list[float] = []
    usage = None
    error = None
    status = None
    sent = time.perf_counter()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.is_error:
                status = response.status_code
                text = (await response.aread()).decode(errors="replace")
                error = f"HTTP {status}: {' '.join(text.split())[:ERROR_BODY_CHARS]}"
            else:
                error, usage = await _read_events(response, deltas)
    except (httpx.HTTPError, json.JSONDecodeError) as caught:
        error = f"{type(caught).__name__}: {caught}"
    finished = time.perf_counter()
    if error is None and not deltas:
        error = "the stream had no content"
    return StreamTiming(
        sent=sent,
        finished=finished,
        deltas=tuple(deltas),
        completion_tokens=usage["completion_tokens"] if usage else len(deltas),
        prompt_tokens=usage.get("prompt_tokens") if usage else None,
        error=error,
        status=status,
    )


async def _read_events(
    response: httpx.Response, deltas: list[float]
) -> tuple[str | None, dict | None]:
    """Read a chat completion's server-sent events, appending each content delta's arrival
    time to `deltas`; the stream's error event (None without one) and its last `usage`."""
    usage = None
    async for line in response.aiter_lines():
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line.removeprefix("data:"))
        if "error" in chunk:
            return f"error event: {chunk['error']}", usage
        usage = chunk.get("usage") or usage
        choices = chunk.get("choices") or []
        if choices and choices[0].get("delta", {}).get("content"):
            deltas.append(time.perf_counter())
    return None, usage


async def run_level(
    url: str,
    *,
    concurrency: int,
    num_requests: int,
    max_tokens: int,
    first_index: int,
    timeout: float,
    varied_lengths: bool = False,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[StreamTiming]:
    """Send requests `first_index ...` keeping `concurrency` in flight; timings in send order.
    With `varied_lengths`, each request's prompt has its own filler (`messages_for`).

    `transport` replaces the network (tests pass an `httpx.MockTransport`).

    Raises:
        ValueError: `concurrency` < 1 or `num_requests` < `concurrency`.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if num_requests < concurrency:
        raise ValueError(f"num_requests must be >= concurrency ({concurrency}), got {num_requests}")
    indices = iter(range(first_index, first_index + num_requests))
    timings: list[StreamTiming] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeouts = httpx.Timeout(timeout, connect=5.0)
    async with httpx.AsyncClient(timeout=timeouts, limits=limits, transport=transport) as client:

        async def slot() -> None:
            # The tasks share one iterator: each takes the next index when it is free.
            for index in indices:
                messages = messages_for(index, varied_length=varied_lengths)
                timings.append(await stream_chat(client, url, messages, max_tokens))

        await asyncio.gather(*(slot() for _ in range(concurrency)))
    return sorted(timings, key=lambda timing: timing.sent)
