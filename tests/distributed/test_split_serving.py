"""`mlxcel serve` over several local ranks on the real SmolLM2 (`--tp 3`, `--pp 2`,
`--disaggregate`): completions with the same greedy tokens as a one-process server, alone,
two at once (decoded in one batch) and streamed."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from live_server import LiveServer
from metric_samples import metric_samples

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


def _serve_and_answer(
    flags: tuple[str, ...], model: str, check: Callable[[LiveServer], None] | None = None
) -> dict[str, list[str]]:
    """The server's answers; `check(server)` runs after them, before the server stops."""
    server = LiveServer(*flags, startup_seconds=STARTUP_SECONDS)
    try:
        answers = _answers(server, model)
        if check is not None:
            with server.stderr_on_failure():
                check(server)
        return answers
    finally:
        assert server.stop() == 0, server.stderr()


def _check_stage_metrics(server: LiveServer) -> None:
    """`--pp 2`: both stages reported every step with the bytes they sent on, rank 0 the
    hidden states (576 float32 features per token), rank 1 the logits (49,152 float32
    logits per row)."""
    samples = metric_samples(httpx.get(server.url + "/metrics", timeout=10).text)
    steps = samples["mlxcel:step_forward_seconds_count"]
    assert steps >= MAX_TOKENS
    for rank in ("0", "1"):
        assert samples[f'mlxcel:stage_step_seconds_count{{rank="{rank}"}}'] == steps
        assert samples[f'mlxcel:stage_step_seconds_sum{{rank="{rank}"}}'] > 0
    assert samples['mlxcel:stage_sent_bytes_total{rank="0"}'] >= steps * 576 * 4
    assert samples['mlxcel:stage_sent_bytes_total{rank="1"}'] >= steps * 49152 * 4


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
    if split[0] == "--pp":
        flags, check = (*_flags(smollm2_path), *split, "--metrics"), _check_stage_metrics
    else:
        flags, check = (*_flags(smollm2_path), *split), None
    assert _serve_and_answer(flags, smollm2_path.name, check) == one_process
