"""benchmarks/serve_bench.py and load_gen.py: statistics, argument parsing, the closed loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from benchmark_scripts import load_benchmark

# serve_bench imports load_gen by its bare name, as it does when run as a script.
load_gen = load_benchmark("load_gen")
serve_bench = load_benchmark("serve_bench")


def make_timing(sent: float, deltas: list[float], tokens: int, error: str | None = None):
    finished = deltas[-1] if deltas else sent + 1.0
    return load_gen.StreamTiming(sent, finished, tuple(deltas), tokens, 100, error)


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]

    assert load_gen.percentile(values, 50) == 2.5
    assert load_gen.percentile(values, 95) == pytest.approx(3.85)
    assert load_gen.percentile(values, 0) == 1.0
    assert load_gen.percentile(values, 100) == 4.0
    assert load_gen.percentile([7.0], 95) == 7.0


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_rejects_empty_values_and_q_out_of_range(values, q) -> None:
    with pytest.raises(ValueError):
        load_gen.percentile(values, q)


def test_inter_token_gaps_are_differences_of_successive_deltas() -> None:
    assert load_gen.inter_token_gaps([1.0, 1.5, 2.25]) == [0.5, 0.75]
    assert load_gen.inter_token_gaps([1.0]) == []


def test_summarize_level_pools_gaps_and_counts_failures_in_wall_time_only() -> None:
    timings = [
        make_timing(0.0, [1.0, 1.5, 2.0], tokens=3),
        make_timing(0.0, [2.0, 3.0], tokens=4),  # a delta may carry several tokens
        make_timing(0.5, [], tokens=0, error="ReadTimeout: timed out"),  # finished at 1.5
    ]

    stats = load_gen.summarize_level(3, timings)

    assert (stats.num_requests, stats.num_failed) == (3, 1)
    assert stats.errors == ("ReadTimeout: timed out",)
    assert stats.wall == 3.0
    assert stats.completion_tokens == 7
    assert stats.output_tps == pytest.approx(7 / 3)
    assert (stats.ttft_p50, stats.ttft_p95) == pytest.approx((1.5, 1.95))
    assert (stats.itl_p50, stats.itl_p95) == pytest.approx((0.5, 0.95))  # gaps 0.5, 0.5, 1
    assert stats.stream_tps_p50 == pytest.approx(2.5)  # streams at 2 and 3 tokens/s


def test_summarize_level_reports_the_fewest_and_most_prompt_tokens() -> None:
    timings = [
        load_gen.StreamTiming(0.0, 2.0, (1.0, 2.0), 2, prompt_tokens, None)
        for prompt_tokens in (70, None, 50, 61)
    ]
    assert load_gen.summarize_level(4, timings).prompt_tokens == (50, 70)


def test_summarize_level_of_only_failures_has_no_latencies() -> None:
    failures = [make_timing(0.0, [], tokens=0, error=e) for e in ("refused", "reset", "refused")]
    stats = load_gen.summarize_level(3, failures)

    assert stats.num_failed == 3
    assert stats.errors == ("refused", "reset")
    assert stats.output_tps == 0.0
    assert stats.ttft_p95 != stats.ttft_p95  # NaN


SSE_EVENTS = [
    {"choices": [{"delta": {"role": "assistant"}}]},
    {"choices": [{"delta": {"content": "Once"}}]},
    {"choices": [{"delta": {"content": " upon a"}}]},
    {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 3}},
]
SSE_REPLY = "".join(f"data: {json.dumps(event)}\n\n" for event in SSE_EVENTS) + "data: [DONE]\n\n"


def sse_handler(seen: list[dict], in_flight: list[int], peak: list[int]):
    async def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.01)  # let the other slots send theirs
        in_flight[0] -= 1
        return httpx.Response(200, text=SSE_REPLY, headers={"content-type": "text/event-stream"})

    return handle


def test_run_level_keeps_concurrency_in_flight_with_distinct_prompts() -> None:
    seen, in_flight, peak = [], [0], [0]
    transport = httpx.MockTransport(sse_handler(seen, in_flight, peak))

    timings = asyncio.run(
        load_gen.run_level(
            "http://bench", concurrency=3, num_requests=7, max_tokens=8, first_index=10,
            timeout=5.0, transport=transport,
        )
    )  # fmt: skip

    assert len(timings) == 7 and all(timing.ok for timing in timings)
    assert peak[0] == 3
    assert {timing.completion_tokens for timing in timings} == {3}
    assert {len(timing.deltas) for timing in timings} == {2}
    systems = [body["messages"][0]["content"] for body in seen]
    assert sorted(int(text.split(".")[0]) for text in systems) == list(range(10, 17))
    assert all(body["stream_options"] == {"include_usage": True} for body in seen)
    assert all(body["temperature"] == 0.0 and body["max_tokens"] == 8 for body in seen)


def test_varied_lengths_give_149_consecutive_requests_149_prompt_lengths() -> None:
    def user_length(index: int, varied: bool) -> int:
        return len(load_gen.messages_for(index, varied_length=varied)[1]["content"])

    assert len({user_length(index, True) for index in range(300, 449)}) == 149
    assert {user_length(index, False) for index in range(300, 449)} == {len(load_gen.USER_MESSAGE)}
    assert load_gen.messages_for(7, varied_length=True)[0] == load_gen.messages_for(7)[0]


def test_stream_chat_records_an_error_status_or_event_as_a_failure() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if b'"0.' in request.content:
            return httpx.Response(503, text="loading")
        return httpx.Response(200, text='data: {"error": {"message": "engine stopped"}}\n\n')

    async def send(index: int):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            return await load_gen.stream_chat(
                client, "http://bench", load_gen.messages_for(index), 4
            )

    unavailable, stopped = asyncio.run(send(0)), asyncio.run(send(1))

    assert (unavailable.status, unavailable.error) == (503, "HTTP 503: loading")
    assert (stopped.status, stopped.error) == (None, "error event: {'message': 'engine stopped'}")


class RunningServer:
    def poll(self) -> None:
        return None


def test_readiness_waits_through_loading_and_stops_at_a_refusal() -> None:
    replies = iter([httpx.Response(503, text="loading"), httpx.Response(200, text=SSE_REPLY)])
    serve_bench.wait_until_ready(
        "http://bench", RunningServer(), 5.0, transport=httpx.MockTransport(lambda _: next(replies))
    )
    refusal = httpx.Response(400, json={"error": {"message": "the model has no chat template"}})
    with pytest.raises(RuntimeError, match=r"HTTP 400: .*the model has no chat template"):
        serve_bench.wait_until_ready(
            "http://bench", RunningServer(), 5.0, transport=httpx.MockTransport(lambda _: refusal)
        )


@pytest.mark.parametrize(
    ("spec", "concurrency", "expected"), [(None, 4, 4), ("2x", 4, 8), ("10", 4, 10)]
)
def test_requests_for_level(spec, concurrency, expected) -> None:
    assert serve_bench.requests_for_level(spec, concurrency) == expected


@pytest.mark.parametrize("spec", ["3", "0x", "many", "x"])
def test_requests_for_level_rejects_fewer_than_concurrency_or_malformed(spec) -> None:
    with pytest.raises(ValueError, match="--requests-per-level"):
        serve_bench.requests_for_level(spec, 4)


def test_parse_concurrency() -> None:
    assert serve_bench.parse_concurrency("1, 4,16") == (1, 4, 16)
    for text in ("0,4", "", "one"):
        with pytest.raises(ValueError, match="--concurrency"):
            serve_bench.parse_concurrency(text)


def test_parse_memory_reads_rss_and_peak_in_bytes() -> None:
    status = "Name:\tpython\nVmHWM:\t  409600 kB\nVmRSS:\t  307200 kB\nThreads:\t7\n"

    assert serve_bench.parse_memory(status) == serve_bench.Memory(300 << 20, 400 << 20)


def test_server_commands_ask_for_max_concurrency() -> None:
    mlxcel, _ = serve_bench.server_command("mlxcel", Path("/m"), 8000, 16)
    mlx_lm, environ = serve_bench.server_command("mlx-lm", Path("/m"), 8000, 16)

    assert mlxcel[-2:] == ["-np", "16"]
    assert mlx_lm[-4:] == ["--decode-concurrency", "16", "--prompt-concurrency", "16"]
    assert "LD_PRELOAD" not in environ


def test_a_run_reports_the_range_of_its_levels_prompt_tokens() -> None:
    memory = serve_bench.Memory(1, 1)
    levels = tuple(
        (load_gen.LevelStats(1, 1, 0, 1.0, 8, 8.0, 0.1, 0.1, 0.1, 0.1, 8.0, tokens), memory)
        for tokens in ((197, 230), None, (201, 271))
    )
    table = serve_bench.format_run(serve_bench.ServerRun("mlxcel", memory, levels), 8)
    assert table.startswith("mlxcel: max_tokens 8, temperature 0, 197-271 prompt tokens,")


def test_ratios_compare_mlxcel_with_each_other_server_per_level() -> None:
    def run(name: str, tps: float, ttft: float):
        stats = load_gen.LevelStats(4, 4, 0, 1.0, 10, tps, ttft, ttft, 0.1, 0.1, 5.0, (50, 50))
        memory = serve_bench.Memory(1, 1)
        return serve_bench.ServerRun(name, memory, ((stats, memory),))

    report = serve_bench.format_report([run("mlxcel", 20.0, 0.5), run("mlx-lm", 10.0, 1.0)], 8)

    assert "mlxcel / mlx-lm" in report
    assert "concurrency   4: throughput 2.00x, TTFT p95 0.50x" in report
    assert "mlxcel: max_tokens 8, temperature 0, 50 prompt tokens," in report
