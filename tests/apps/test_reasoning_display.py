"""Hiding or showing a reply's reasoning: the display module, `mlxcel generate` on a thinking
model whose engine follows a script (one prompt or a prompts file), and `mlxcel serve`'s
reasoning flags."""

from __future__ import annotations

import io
import json

import pytest
from test_cli import assert_one_line_error, run_cli

from mlxcel.cli import make_parser
from mlxcel.common.flags import UsageError, resolve_defaults
from mlxcel.generation import generate_command
from mlxcel.generation.reasoning_display import DIM, RESET, ReasoningDisplay
from mlxcel.serving import serve_command
from mlxcel_core.reasoning import ReasoningMarkers, ReasoningPhase
from mlxcel_server.reasoning import ReasoningFormat

THINK = ReasoningMarkers("<think>", "</think>")
REPLY = "<think>\nCheck.\n</think>\n\nDone."


def display(text: str, *, piece: int = 3, markers=THINK, **options) -> str:
    out = io.StringIO()
    shown = ReasoningDisplay(out, markers, ReasoningPhase.BEFORE, **options)
    for start in range(0, len(text), piece):
        shown.write(text[start : start + piece])
    shown.finish()
    return out.getvalue()


@pytest.mark.parametrize("piece", [1, 3, 100])
def test_reasoning_is_hidden_by_default(piece):
    assert display(REPLY, piece=piece) == "Done."


@pytest.mark.parametrize("piece", [1, 3, 100])
def test_shown_reasoning_precedes_the_answer_plainly(piece):
    assert display(REPLY, piece=piece, show=True) == "Check.\n\nDone."


def test_shown_reasoning_is_dimmed_for_a_terminal():
    out = display(REPLY, piece=100, show=True, dim=True)
    assert out == f"{DIM}Check.{RESET}\n\nDone."


def test_without_markers_the_text_prints_as_it_is():
    assert display(REPLY, markers=None) == REPLY


@pytest.fixture
def generate(monkeypatch, thinking_model, tiny_gguf):
    monkeypatch.setattr(generate_command, "load_target_model", lambda *_, **__: thinking_model)

    def run(*flags: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
        argv = ("generate", "-m", str(tiny_gguf), "-p", "Hi", "--temp", "0", "-n", "16")
        return run_cli(*argv, *flags, environ=environ)

    return run


def test_generate_hides_the_reasoning(generate):
    code, out, _ = generate()
    assert (code, out) == (0, "OK\n")


def test_generate_shows_the_reasoning_when_asked(generate):
    assert generate("--show-reasoning")[1] == "Plan\n\nOK\n"
    assert generate(environ={"MLXCEL_SHOW_REASONING": "1"})[1] == "Plan\n\nOK\n"


def test_generate_reasoning_budget(generate):
    assert generate("--show-reasoning", "--reasoning-budget", "1")[1] == "P\n\nOK\n"


@pytest.mark.parametrize(
    ("flags", "reasoning"),
    [
        ((), None),
        (("--show-reasoning",), "Plan"),
        (("--show-reasoning", "--reasoning-budget", "2"), "Pl"),
    ],
)
def test_batch_replies_keep_the_reasoning_apart(
    monkeypatch, thinking_model, tiny_gguf, tmp_path, flags, reasoning
):
    monkeypatch.setattr(generate_command, "load_target_model", lambda *_, **__: thinking_model)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi\nHello\n")
    code, out, _ = run_cli(
        "generate", "-m", str(tiny_gguf), "--prompts-file", str(prompts), "--temp", "0", *flags
    )
    assert code == 0
    replies = [json.loads(line) for line in out.splitlines()]
    assert [(r.get("reasoning"), r["text"]) for r in replies] == [(reasoning, "OK")] * 2


def test_generate_rejects_a_bad_budget(generate):
    code, _, err = generate("--reasoning-budget", "-2")
    assert_one_line_error(code, err, 2, "--reasoning-budget must be -1 or >= 0")


def serve_settings(argv, environ):
    args = make_parser("serve").parse_args(["serve", *argv])
    resolve_defaults(args, serve_command.FLAGS, environ)
    return serve_command.settings_from(args)


def test_serve_reasoning_flags_and_their_environment_mirrors():
    default = serve_settings([], {})
    assert (default.reasoning_format, default.reasoning_budget) == (ReasoningFormat.AUTO, -1)
    chosen = serve_settings(["--reasoning-format", "none", "--reasoning-budget", "0"], {})
    assert (chosen.reasoning_format, chosen.reasoning_budget) == (ReasoningFormat.NONE, 0)
    environ = {"LLAMA_ARG_THINK": "deepseek-legacy", "LLAMA_ARG_THINK_BUDGET": "64"}
    mirrored = serve_settings([], environ)
    assert mirrored.reasoning_format is ReasoningFormat.DEEPSEEK_LEGACY
    assert mirrored.reasoning_budget == 64


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reasoning-format", "think"], "--reasoning-format must be one of none, deepseek"),
        (["--reasoning-budget", "-5"], "--reasoning-budget must be -1 or >= 0, got -5"),
    ],
)
def test_serve_refuses_bad_reasoning_flags(argv, message):
    with pytest.raises(UsageError, match=message):
        serve_settings(argv, {})
