"""Speculative decoding on the real SmolLM2 (CPU): greedy output with a draft model is the
output without one, token for token over 100 tokens, on the command line and the server.

Two drafts: the model itself (every draft should pass) and its first 8 of 30 layers
exported as an mlx-lm folder (most drafts fail), so both the accepting and the rejecting
paths of the verification run. The reference is plain greedy decoding, from a real
`mlxcel generate` process; the drafted runs call the same command in-process.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mlxcel.cli import main

from benchmark_scripts import load_benchmark
from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

PROMPT = "Write a long, detailed story about a dragon who learns to bake bread."
NUM_TOKENS = 100
DRAFT_LAYERS = 8
# Every prefix of a greedy reply is a valid draft, so the model drafting for itself accepts
# nearly everything; what it rejects comes from arithmetic differences between a verify
# pass of several tokens and single-token decoding.
SELF_DRAFT_MIN_ACCEPTANCE = 0.9

export_mlx_lm = load_benchmark("export_mlx_lm")


@pytest.fixture(scope="module")
def shallow_draft(smollm2_path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("draft") / "smollm2-8-layers"
    return export_mlx_lm.export_gguf(smollm2_path, folder, num_layers=DRAFT_LAYERS)


def command(*flags: str) -> list[str]:
    return ["generate", "-p", PROMPT, "-n", str(NUM_TOKENS), "--temp", "0", *flags]


def generate_in_a_process() -> str:
    """`mlxcel generate` as a user runs it (a process of its own, with OpenBLAS if present)."""
    result = subprocess.run(
        [sys.executable, "-m", "mlxcel", *command()],
        capture_output=True,
        text=True,
        timeout=900,
        env={k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")},
    )
    assert result.returncode == 0, result.stderr
    assert f"generated: {NUM_TOKENS} tokens" in result.stderr
    return result.stdout


def generate(*flags: str) -> tuple[str, str]:
    """The same command with a draft, in this process: its stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = main(command(*flags), environ={}, out=out, err=err)
    assert code == 0, err.getvalue()
    assert f"generated: {NUM_TOKENS} tokens" in err.getvalue()
    return out.getvalue(), err.getvalue()


def draft_counts(stderr: str) -> tuple[int, int]:
    match = re.search(r"draft: (\d+) tokens verified, (\d+) accepted", stderr)
    assert match is not None, stderr
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(scope="module")
def reference() -> str:
    return generate_in_a_process()


def test_the_model_as_its_own_draft_changes_nothing_and_accepts_nearly_all(reference, smollm2_path):
    text, err = generate("-md", str(smollm2_path), "--draft-max", "4", "--draft-p-min", "0")
    verified, accepted = draft_counts(err)
    assert text == reference
    assert verified >= NUM_TOKENS // 2
    assert accepted / verified >= SELF_DRAFT_MIN_ACCEPTANCE


def test_a_truncated_layer_draft_changes_nothing_though_most_drafts_fail(reference, shallow_draft):
    text, err = generate("-md", str(shallow_draft), "--draft-max", "4")
    verified, accepted = draft_counts(err)
    assert text == reference
    assert verified >= 20
    assert accepted / verified < SELF_DRAFT_MIN_ACCEPTANCE


@pytest.mark.parametrize("draft", ["self", "shallow"])
def test_the_server_gives_the_same_greedy_reply_with_a_draft(
    reference, smollm2_path, shallow_draft, draft
):
    # The model drafting for itself drafts at every step; the shallow draft only where it is
    # confident (the default --draft-p-min), which is where it is most often wrong.
    if draft == "self":
        flags = ("-md", str(smollm2_path), "--draft-max", "4", "--draft-p-min", "0")
    else:
        flags = ("-md", str(shallow_draft), "--draft-max", "4")
    server = LiveServer(*flags, "-np", "2", "--metrics")
    try:
        with server.stderr_on_failure():
            body = httpx.post(
                server.url + "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": PROMPT}],
                    "max_tokens": NUM_TOKENS,
                    "temperature": 0,
                },
                timeout=600,
            ).json()
            metrics = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    assert body["choices"][0]["message"]["content"] == reference.removesuffix("\n")
    timings = body["timings"]
    assert timings["draft_n"] > 0
    if draft == "self":
        assert timings["draft_n_accepted"] / timings["draft_n"] >= SELF_DRAFT_MIN_ACCEPTANCE
    assert f"mlxcel:draft_n_total {float(timings['draft_n'])}" in metrics
    assert f"mlxcel:draft_n_accepted_total {float(timings['draft_n_accepted'])}" in metrics
