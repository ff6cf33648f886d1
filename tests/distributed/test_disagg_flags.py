"""`mlxcel serve --disaggregate` refuses at start, before any rank starts or any weight
loads, the flags it does not support; its environment mirror sets it too."""

from __future__ import annotations

import pytest
from cli_runs import run_mlxcel


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tp", "3"], "--disaggregate does not support --tp or --pp"),
        (["--pp", "2"], "--disaggregate does not support --tp or --pp"),
        (
            ["--prompt-lookup-max", "3"],
            "--disaggregate does not support speculative decoding (-md, --prompt-lookup-max)",
        ),
        (
            ["-ctk", "q8_0", "-ctv", "q8_0"],
            "--disaggregate needs -ctk and -ctv to be the same one of auto, f32, f16, bf16; "
            "got q8_0 and q8_0",
        ),
        (
            ["-ctv", "f16"],
            "--disaggregate needs -ctk and -ctv to be the same one of auto, f32, f16, bf16; "
            "got auto and f16",
        ),
    ],
)
def test_unsupported_flags_are_refused_in_one_line(smollm2_path, no_spawning, flags, message):
    code, err = run_mlxcel(["serve", "-m", str(smollm2_path), "--disaggregate", *flags])
    assert (code, err) == (2, f"mlxcel: error: {message}\n")


def test_the_environment_mirror_turns_it_on(smollm2_path, no_spawning):
    code, err = run_mlxcel(
        ["serve", "-m", str(smollm2_path), "--tp", "3"], {"MLXCEL_DISAGGREGATE": "1"}
    )
    assert (code, err) == (2, "mlxcel: error: MLXCEL_DISAGGREGATE does not support --tp or --pp\n")
