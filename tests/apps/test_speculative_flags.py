"""Speculative decoding's flags through `main(argv)` on the tiny float32 llama: greedy text is
unchanged by a drafter, and bad combinations get one line and exit code 2."""

from __future__ import annotations

import io
import json

import pytest

from mlxcel.cli import main


def run_cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def generate(model, *flags: str, environ: dict[str, str] | None = None) -> tuple[str, str]:
    code, out, err = run_cli(
        "generate", "-m", str(model), "-p", "hello hello", "-no-cnv", "--temp", "0", "-n", "24",
        *flags, environ=environ,
    )  # fmt: skip
    assert code == 0, err
    return out, err


def test_drafters_leave_greedy_text_unchanged_and_report_their_drafts(tiny_safetensors):
    plain, plain_err = generate(tiny_safetensors)
    assert "draft:" not in plain_err
    drafted, err = generate(tiny_safetensors, "-md", str(tiny_safetensors), "--draft-p-min", "0")
    assert drafted == plain
    assert "draft:" in err and "accepted" in err
    looked_up, _ = generate(tiny_safetensors, "--prompt-lookup-max", "2")
    assert looked_up == plain
    environ = {
        "LLAMA_ARG_MODEL_DRAFT": str(tiny_safetensors),
        "LLAMA_ARG_DRAFT_MAX": "3",
        "LLAMA_ARG_DRAFT_P_MIN": "0",
    }
    from_env, env_err = generate(tiny_safetensors, environ=environ)
    assert from_env == plain and "draft:" in env_err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--prompt-lookup-max", "2", "-md", "DRAFT"), "pick one"),
        (("-md", "DRAFT", "--spec-acceptance", "typical"), "rejection, exact"),
        (("-md", "DRAFT", "--draft-max", "2", "--draft-min", "3"), "--draft-min must be in"),
        (("-md", "DRAFT", "--draft", "-1"), "--draft/--draft-n/--draft-max must be >= 1"),
        (("-md", "DRAFT", "--draft-p-min", "1.5"), "--draft-p-min must be in [0, 1]"),
        (("--prompt-lookup-max", "-1"), "--prompt-lookup-max must be >= 0"),
        (("--prompt-lookup-max", "2", "--prompt-lookup-min", "3"), "--prompt-lookup-max must"),
        # Refused with speculation off too, rather than kept unused.
        (("--spec-acceptance", "bogus"), "rejection, exact"),
        (("--draft-p-min", "5"), "--draft-p-min must be in [0, 1]"),
    ],
)
def test_bad_speculative_flags_are_usage_errors(tiny_safetensors, flags, message):
    flags = tuple(str(tiny_safetensors) if flag == "DRAFT" else flag for flag in flags)
    code, _, err = run_cli("generate", "-m", str(tiny_safetensors), "-p", "hi", *flags)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    # Checked before the model loads (no progress bar), naming flags, never fields.
    assert "loading" not in err
    assert "num_draft_tokens" not in err and "prompt_lookup" not in err


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_a_missing_draft_model_fails_naming_it_before_loading_or_listening(
    tiny_safetensors, tmp_path, command
):
    missing = tmp_path / "no-such-draft"
    argv = [command, "-m", str(tiny_safetensors), "-md", str(missing)]
    code, _, err = run_cli(*argv, *(["-p", "hi"] if command == "generate" else ["--port", "1"]))
    assert code == 1
    assert err.strip() == f"mlxcel: error: draft model not found: {missing}"


def test_batch_generation_reports_its_drafts(tiny_safetensors, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello hello\nhello there\n")
    code, out, err = run_cli(
        "generate", "-m", str(tiny_safetensors), "--prompts-file", str(prompts), "-no-cnv",
        "--temp", "0", "-n", "16", "-md", str(tiny_safetensors), "--draft-p-min", "0",
    )  # fmt: skip
    assert code == 0, err
    replies = [json.loads(line) for line in out.splitlines()]
    assert all(r["draft_tokens"] > 0 for r in replies)
    assert all(0 <= r["accepted_draft_tokens"] <= r["draft_tokens"] for r in replies)
    assert "draft:" in err
