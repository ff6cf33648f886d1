"""`mlxcel serve` over several local ranks on the real SmolLM2 (`--tp 3`, `--pp 2`,
`--disaggregate`): completions with the same greedy tokens as a one-process server, alone,
two at once (decoded in one batch) and streamed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
)
MAX_TOKENS = 8
# Several ranks each loading the model take minutes to start on a loaded 2-core machine.
STARTUP_SECONDS = 300


def _flags(model: Path) -> tuple[str, ...]:
    return ("-m", str(model), "-c", "512", "-np", "2")


def _answers(server: LiveServer, model: str) -> dict[str, list[str]]:
    client = server.client()

    def complete(prompt: str) -> str:
        reply = client.completions.create(
            model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert reply.usage.completion_tokens == MAX_TOKENS
        return reply.choices[0].text

    def stream(prompt: str) -> str:
        chunks = client.completions.create(
            model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)

    with server.stderr_on_failure():
        alone = [complete(prompt) for prompt in PROMPTS]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(complete, PROMPTS[1:]))
        streamed = [stream(prompt) for prompt in PROMPTS]
    return {"alone": alone, "together": together, "streamed": streamed}


def _serve_and_answer(flags: tuple[str, ...], model: str) -> dict[str, list[str]]:
    server = LiveServer(*flags, startup_seconds=STARTUP_SECONDS)
    try:
        return _answers(server, model)
    finally:
        assert server.stop() == 0, server.stderr()


@pytest.fixture(scope="module")
def one_process(smollm2_path) -> dict[str, list[str]]:
    answers = _serve_and_answer(_flags(smollm2_path), smollm2_path.name)
    assert all(answers["alone"])
    assert answers["together"] == answers["alone"][1:]
    assert answers["streamed"] == answers["alone"]
    return answers


@pytest.mark.parametrize(
    "split", [("--tp", "3"), ("--pp", "2"), ("--disaggregate",)], ids=["tp3", "pp2", "disagg"]
)
def test_a_split_server_answers_as_one_process(smollm2_path, one_process, split, monkeypatch):
    # The ranks share the cores; one BLAS thread each keeps them from spinning on each other.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    answers = _serve_and_answer((*_flags(smollm2_path), *split), smollm2_path.name)
    assert answers == one_process
