"""`mlxcel serve --pp 2` on the real SmolLM2: two local stages over loopback answer
completions with the same greedy tokens as a one-process server, alone and batched."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
)
MAX_TOKENS = 8


def _answers(server: LiveServer, model: str) -> tuple[list[str], list[str]]:
    """Each prompt alone, then the last two at once (decoded in one batch)."""
    client = server.client()

    def complete(prompt: str) -> str:
        reply = client.completions.create(
            model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert reply.usage.completion_tokens == MAX_TOKENS
        return reply.choices[0].text

    with server.stderr_on_failure():
        alone = [complete(prompt) for prompt in PROMPTS]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(complete, PROMPTS[1:]))
    return alone, together


def test_pp_2_server_answers_as_one_process(smollm2_path, monkeypatch):
    # Two ranks share the cores; one BLAS thread each keeps them from spinning on each other.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    flags = ("-m", str(smollm2_path), "-c", "512", "-np", "2")
    one = LiveServer(*flags)
    try:
        expected, expected_together = _answers(one, smollm2_path.name)
    finally:
        assert one.stop() == 0, one.stderr()
    split = LiveServer(*flags, "--pp", "2")
    try:
        alone, together = _answers(split, smollm2_path.name)
    finally:
        assert split.stop() == 0, split.stderr()
    assert alone == expected and all(expected)
    assert together == expected_together == expected[1:]
