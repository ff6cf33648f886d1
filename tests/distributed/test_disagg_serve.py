"""`mlxcel serve --disaggregate` on the real SmolLM2: rank 1 prefills, rank 0 decodes;
its greedy tokens equal a one-process server's, streamed and not."""

from __future__ import annotations

import pytest

from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
)
MAX_TOKENS = 8


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
