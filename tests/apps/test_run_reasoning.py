"""`mlxcel run` on a thinking model whose network follows a script: the reasoning hidden,
shown, bounded or switched off, and only the answer kept in the conversation."""

from __future__ import annotations

import io
import sys

import pytest
from test_cli import assert_one_line_error, run_cli

from mlxcel.generation import run_command
from mlxcel.generation.chat_session import ChatSession, ChatSettings
from mlxcel_core.engine import Engine, EngineConfig
from mlxcel_core.sampling import SamplingParams


@pytest.fixture
def chat(monkeypatch, thinking_model, tiny_gguf):
    monkeypatch.setattr(run_command, "load_target_model", lambda *_, **__: thinking_model)

    def run(*flags: str, stdin: str = "Hi\nHello\n", environ=None) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        return run_cli("run", str(tiny_gguf), "--temp", "0", "-n", "16", *flags, environ=environ)

    return run


def test_run_hides_the_reasoning(chat):
    code, out, err = chat()
    assert (code, out) == (0, "OK\nOK\n"), err


def test_run_shows_the_reasoning_when_asked(chat):
    assert chat("--show-reasoning")[1] == "Plan\n\nOK\nPlan\n\nOK\n"
    assert chat(environ={"MLXCEL_SHOW_REASONING": "1"})[1] == "Plan\n\nOK\nPlan\n\nOK\n"


def test_run_reasoning_budget(chat):
    assert chat("--show-reasoning", "--reasoning-budget", "2")[1] == "Pl\n\nOK\nPl\n\nOK\n"
    assert chat("--show-reasoning", environ={"LLAMA_ARG_THINK_BUDGET": "1"})[1] == (
        "P\n\nOK\nP\n\nOK\n"
    )


def test_run_prompt_flag_takes_the_reasoning_flags(chat):
    assert chat("-p", "Hi")[1] == "OK\n"
    assert chat("-p", "Hi", "--show-reasoning", "--reasoning-budget", "3")[1] == "Pla\n\nOK\n"


def test_run_rejects_a_bad_budget(chat):
    code, _, err = chat("--reasoning-budget", "-2")
    assert_one_line_error(code, err, 2, "--reasoning-budget must be -1 or >= 0")


@pytest.fixture
def make_session(thinking_model):
    engines = []

    def make(reasoning_budget: int = -1) -> ChatSession:
        engine = Engine(
            thinking_model.model,
            EngineConfig(context_size=256, block_size=16, num_kv_blocks=64),
        )
        engines.append(engine)
        settings = ChatSettings(
            params=SamplingParams(temperature=0.0),
            context_size=256,
            max_tokens=16,
            chat_template=None,
            reasoning_budget=reasoning_budget,
        )
        return ChatSession(engine, thinking_model.tokenizer, settings)

    yield make
    for engine in engines:
        engine.shutdown()


def test_the_conversation_keeps_the_answer_without_the_reasoning(make_session, thinking_model):
    session = make_session()
    answer, reasoning = [], []
    result = session.send("Hi", answer.append, reasoning.append)
    assert (result.text, "".join(answer), "".join(reasoning)) == ("OK", "OK", "Plan")
    assert session.turns == (
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "OK"},
    )
    second = thinking_model.tokenizer.decode(
        session.prompt_tokens("Hello"), skip_special_tokens=False
    )
    assert "OK<|im_end|>" in second
    assert "Plan" not in second


def test_a_zero_budget_switches_thinking_off_in_the_template(make_session, thinking_model):
    prompt = make_session(reasoning_budget=0).prompt_tokens("Hi")
    assert thinking_model.tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
    assert thinking_model.tokenizer.decode(make_session().prompt_tokens("Hi")).endswith("<think>\n")
