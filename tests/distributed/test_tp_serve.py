"""`mlxcel serve --tp 3` on the real SmolLM2: three local ranks over loopback answer
completions with the same greedy tokens as a one-process server, alone and batched."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from live_server import LiveServer

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


@pytest.mark.slow
@pytest.mark.long
def test_tp_3_server_answers_as_one_process(smollm2_path):
    flags = ("-m", str(smollm2_path), "-c", "512", "-np", "2")
    one = LiveServer(*flags)
    try:
        expected, expected_together = _answers(one, smollm2_path.name)
    finally:
        assert one.stop() == 0, one.stderr()
    split = LiveServer(*flags, "--tp", "3")
    try:
        alone, together = _answers(split, smollm2_path.name)
    finally:
        assert split.stop() == 0, split.stderr()
    assert alone == expected and all(expected)
    assert together == expected_together == expected[1:]
