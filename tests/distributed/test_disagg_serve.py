"""`mlxcel serve --disaggregate` on the real SmolLM2: rank 1 prefills, rank 0 decodes.

Its greedy tokens equal a one-process server's, streamed and not; and a long prompt sent
while another request streams does not pause that stream for longer than a decode step,
as prefilling it in the same process does.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time

import pytest

from filler_text import filler
from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
)
MAX_TOKENS = 8
# About 1,500 tokens of SmolLM2's tokenizer.
LONG_PROMPT = filler(200) + " The library opens at"
STREAM_TOKENS = 48
# A gap while the long prompt is prefilled may exceed the median decode step by this much:
# the step that takes in its KV writes it into the pools, and on a shared two-core machine
# the prefill rank competes with the decoding one for the cores.
STEP_MARGIN = 2.0


def _answers(server: LiveServer, model: str) -> list[str]:
    """Each prompt alone, then each streamed."""
    client = server.client()
    texts = []
    with server.stderr_on_failure():
        for prompt in PROMPTS:
            reply = client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
            )
            assert reply.usage.completion_tokens == MAX_TOKENS
            texts.append(reply.choices[0].text)
        for prompt in PROMPTS:
            stream = client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
            )
            texts.append("".join(chunk.choices[0].text for chunk in stream if chunk.choices))
    return texts


def test_disaggregated_server_answers_as_one_process(smollm2_path):
    flags = ("-m", str(smollm2_path), "-c", "512", "-np", "2")
    one = LiveServer(*flags)
    try:
        expected = _answers(one, smollm2_path.name)
    finally:
        assert one.stop() == 0, one.stderr()
    pair = LiveServer(*flags, "--disaggregate")
    try:
        answers = _answers(pair, smollm2_path.name)
    finally:
        assert pair.stop() == 0, pair.stderr()
    assert answers == expected and all(expected)
    assert answers[: len(PROMPTS)] == answers[len(PROMPTS) :]


def _stream_gaps_during_long_prefill(server: LiveServer, model: str) -> tuple[list[float], float]:
    """Stream a reply; after a few tokens, send the long prompt. Returns the stream's gaps
    between consecutive tokens before the long prompt was sent, and the longest gap while
    it was being prefilled (from its sending to its answer)."""
    client = server.client()
    arrivals: list[float] = []
    long_window: list[float] = []
    started = threading.Event()

    def send_long_prompt() -> None:
        started.wait()
        long_window.append(time.perf_counter())
        reply = client.completions.create(
            model=model, prompt=LONG_PROMPT, max_tokens=1, temperature=0
        )
        long_window.append(time.perf_counter())
        assert reply.usage.prompt_tokens > 1200

    sender = threading.Thread(target=send_long_prompt)
    sender.start()
    stream = client.completions.create(
        model=model,
        prompt=PROMPTS[2],
        max_tokens=STREAM_TOKENS,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter())
            if len(arrivals) == 8:
                started.set()
    sender.join()
    assert len(long_window) == 2, "the long prompt got no answer"
    sent, answered = long_window
    assert arrivals[-1] > answered, "the stream ended before the long prompt was prefilled"
    before = [b - a for a, b in itertools.pairwise(arrivals) if b <= sent]
    during = [b - a for a, b in itertools.pairwise(arrivals) if b > sent and a < answered]
    return before, max(during)


def test_a_long_prefill_does_not_pause_a_stream(smollm2_path):
    flags = ("-m", str(smollm2_path), "-c", "2048", "-np", "2")
    pair = LiveServer(*flags, "--disaggregate")
    try:
        with pair.stderr_on_failure():
            before, longest = _stream_gaps_during_long_prefill(pair, smollm2_path.name)
    finally:
        assert pair.stop() == 0, pair.stderr()
    step = statistics.median(before)
    assert longest <= step * (1 + STEP_MARGIN), (longest, step)
