"""The residual window on the real SmolLM2 model, from the command line: a window over the
whole context makes a turbo2 cache give f16's greedy text, which turbo2 without one does
not."""

import io

import pytest

from mlxcel.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.long]

PROMPT = "Write a short story about a lighthouse keeper and a storm."
COMMON = ["generate", "-p", PROMPT, "--temp", "0", "-n", "24", "-c", "512", "-np", "1"]


def generate(*flags: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main([*COMMON, *flags], environ={}, out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_a_window_over_the_context_gives_f16_text_on_a_turbo2_cache():
    f16 = generate("-ctk", "f16", "-ctv", "f16")
    windowed = generate("-ctk", "turbo2", "-ctv", "turbo2", "--cache-residual", "512")
    assert windowed == f16
    assert generate("-ctk", "turbo2", "-ctv", "turbo2", "--cache-residual", "0") != f16
