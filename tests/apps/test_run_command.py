"""`mlxcel run`: the chat loop, its input and its conversation, on a tiny GGUF model."""

import io
import sys
from dataclasses import replace

import pytest
from test_cli import assert_one_line_error, run_cli

from mlxcel.generation.chat_session import ChatSession, ChatSettings, ConversationTooLongError
from mlxcel.generation.repl import run_repl
from mlxcel.generation.repl_input import PipedReader, read_entry
from mlxcel.generation.run_command import history_path
from mlxcel_core.engine import Engine, EngineConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.loading.loader import load_model

GREEDY = ("--temp", "0")
BLOCK_SIZE = 16
# Tiny-model replies are random tokens, so each is capped; a message is one block or more.
REPLY_TOKENS = 4
LONG_MESSAGE = "tell me about the quick brown fox that jumps over the lazy dog"


def run_piped(monkeypatch, *argv: str, stdin: str, environ=None) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return run_cli("run", *argv, environ=environ)


@pytest.fixture(scope="module")
def tiny_model(tiny_gguf):
    return load_model(tiny_gguf)


class TokenIdDetokenizer:
    """Spells each token as its id: random-weight replies are rarely whole UTF-8
    characters, which the real detokenizer holds back until the reply ends."""

    def add_token(self, token_id: int) -> str:
        return f"<{token_id}>"

    def finalize(self) -> str:
        return ""


class RecordingEngine:
    """The real engine, keeping the prompt of every request it is given."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.prompts: list[tuple[int, ...]] = []
        self.spell_token_ids = False

    def submit(self, requests, sink):
        self.prompts += [request.prompt_ids for request in requests]
        if self.spell_token_ids:
            requests = [replace(r, detokenizer=TokenIdDetokenizer()) for r in requests]
        return self.engine.submit(requests, sink)


@pytest.fixture
def make_session(tiny_model):
    engines = []

    def make(
        *, context_size: int = 256, max_tokens: int = REPLY_TOKENS
    ) -> tuple[ChatSession, RecordingEngine]:
        engine = Engine(
            tiny_model.model,
            EngineConfig(context_size=context_size, block_size=BLOCK_SIZE, num_kv_blocks=64),
        )
        engines.append(engine)
        settings = ChatSettings(
            params=SamplingParams(temperature=0.0),
            context_size=context_size,
            max_tokens=max_tokens,
            chat_template=None,
        )
        recording = RecordingEngine(engine)
        return ChatSession(recording, tiny_model.tokenizer, settings), recording

    yield make
    for engine in engines:
        engine.shutdown()


def ignore(text: str) -> None:
    del text


# Reading entries


def read_all(text: str) -> list[tuple[str, bool]]:
    reader = PipedReader(io.StringIO(text))
    entries = []
    while True:
        try:
            entry = read_entry(reader)
        except EOFError:
            return entries
        entries.append((entry.text, entry.is_command))


def test_entries_are_lines_blocks_and_continued_lines():
    text = (
        'one\n"""two\nthree"""\nfour\\\nfive\n"""six"""\n/clear\n  /exit  \n"""/not a command"""\n'
    )
    assert read_all(text) == [
        ("one", False),
        ("two\nthree", False),
        ("four\nfive", False),
        ("six", False),
        ("/clear", True),
        ("  /exit  ", True),
        ("/not a command", False),
    ]


def test_a_block_or_continuation_cut_by_the_end_of_input_ends_there():
    assert read_all('"""\nfirst\nsecond\n') == [("first\nsecond", False)]
    assert read_all("first\\\n") == [("first", False)]


def test_windows_line_breaks_are_dropped():
    assert read_all("hello\r\n/bye\r\n") == [("hello", False), ("/bye", True)]


# The conversation


def test_each_turn_renders_the_whole_conversation(make_session, tiny_model):
    session, recording = make_session()
    first = session.send(LONG_MESSAGE, ignore)
    second = session.send("and the dog?", ignore)
    first_prompt, second_prompt = recording.prompts
    assert second_prompt[: len(first_prompt)] == first_prompt
    rendered = tiny_model.tokenizer.decode(second_prompt, skip_special_tokens=False)
    assert LONG_MESSAGE in rendered and "and the dog?" in rendered
    assert first.text in rendered
    assert [turn["role"] for turn in session.turns] == ["user", "assistant"] * 2
    assert second.stats.prompt_tokens == len(second_prompt)


def test_the_second_turn_reuses_the_first_turns_cached_blocks(make_session):
    session, _ = make_session()
    first = session.send(LONG_MESSAGE, ignore)
    second = session.send("and the dog?", ignore)
    assert first.stats.cached_tokens == 0
    assert second.stats.cached_tokens >= first.stats.prompt_tokens // BLOCK_SIZE * BLOCK_SIZE
    assert second.stats.cached_tokens % BLOCK_SIZE == 0


def test_clear_forgets_the_turns(make_session, tiny_model):
    session, recording = make_session()
    session.send(LONG_MESSAGE, ignore)
    session.clear()
    session.send("a new start", ignore)
    last_prompt = recording.prompts[-1]
    rendered = tiny_model.tokenizer.decode(last_prompt, skip_special_tokens=False)
    assert LONG_MESSAGE not in rendered and "a new start" in rendered
    assert len(last_prompt) == len(make_session()[0].prompt_tokens("a new start"))


def test_a_message_past_the_context_is_refused_and_not_kept(make_session):
    session, _ = make_session(context_size=32)
    with pytest.raises(ConversationTooLongError, match="context size is 32"):
        session.send(LONG_MESSAGE * 3, ignore)
    assert session.turns == ()
    assert not session.send("hi", ignore).interrupted


def test_an_interrupted_reply_keeps_its_text_and_the_engine_goes_on(make_session):
    session, recording = make_session(max_tokens=200)
    recording.spell_token_ids = True
    pieces = []

    def interrupt_after_three(text: str) -> None:
        pieces.append(text)
        if len(pieces) == 3:
            raise KeyboardInterrupt

    result = session.send("hello", interrupt_after_three)
    assert result.interrupted and result.text == "".join(pieces)
    assert len(pieces) == 3
    assert session.turns[-1] == {"role": "assistant", "content": result.text}
    assert session.send("again", ignore).stats.generated_tokens > 0


# The chat loop


class ScriptedReader:
    """Lines from a list; an exception in it is raised instead of a line."""

    def __init__(self, *lines: str | type[BaseException]) -> None:
        self.lines = list(lines)
        self.prompts: list[str] = []

    def read_line(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if not self.lines:
            raise EOFError
        line = self.lines.pop(0)
        if isinstance(line, type):
            raise line
        return line


def test_ctrl_c_at_the_prompt_gives_a_hint_and_does_not_leave(make_session):
    out, err = io.StringIO(), io.StringIO()
    reader = ScriptedReader(KeyboardInterrupt, "hello", "/exit", "never read")
    assert run_repl(make_session()[0], reader, out, err) == 0
    assert "use /exit or Ctrl-D to leave" in err.getvalue()
    assert out.getvalue().count("\n") == 1
    assert reader.lines == ["never read"]


def test_ctrl_c_in_a_block_drops_it(make_session):
    session, _ = make_session()
    reader = ScriptedReader('"""first line', KeyboardInterrupt, "hello")
    assert run_repl(session, reader, io.StringIO(), io.StringIO()) == 0
    assert [turn["content"] for turn in session.turns[::2]] == ["hello"]
    assert reader.prompts == [">>> ", "... ", ">>> ", ">>> "]


# The command


def test_piped_lines_are_messages_and_only_replies_reach_stdout(monkeypatch, tiny_gguf):
    stdin = 'hello\n\n/help\n"""two\nlines"""\n/nope\n/clear\nlast\\\nline\n/bye\nnever\n'
    code, out, err = run_piped(monkeypatch, str(tiny_gguf), "-n", "3", *GREEDY, stdin=stdin)
    assert code == 0, err
    assert out.count("\n") == 3  # three replies, each ending its line
    assert ">>>" not in out
    assert "/clear       forget the conversation" in err
    assert "unknown command /nope" in err
    assert "the conversation is cleared" in err


def test_a_message_past_the_context_is_one_line_and_the_chat_goes_on(monkeypatch, tiny_gguf):
    stdin = f"{LONG_MESSAGE * 4}\nhi\n"
    code, out, err = run_piped(monkeypatch, str(tiny_gguf), "-c", "48", "-n", "2", stdin=stdin)
    assert code == 1  # the later message is answered, but a script learns one was not
    (notice,) = err.splitlines()
    assert "context size is 48; /clear to start over, or raise -c/--ctx-size" in notice
    assert out.count("\n") == 1


def test_a_reply_that_fills_the_context_says_so(monkeypatch, tiny_gguf):
    code, out, err = run_piped(monkeypatch, str(tiny_gguf), "-c", "40", *GREEDY, stdin="hi\n")
    assert code == 0
    assert "the reply stopped at the end of the context; /clear to start over" in err
    assert out.endswith("\n")


def test_prompt_flag_answers_once_as_generate_does(monkeypatch, tiny_gguf):
    argv = ("-m", str(tiny_gguf), "-p", "hello", "-n", "6", *GREEDY)
    code, out, err = run_piped(monkeypatch, *argv, stdin="not read\n")
    assert code == 0
    assert out == run_cli("generate", *argv)[1] and out.endswith("\n")
    assert "generated: 6 tokens" in err and "load time: " in err


def test_model_argument_and_model_flag(monkeypatch, tiny_gguf, tmp_path):
    model = str(tiny_gguf)
    code, _, err = run_piped(monkeypatch, model, "-m", model, "-n", "1", stdin="hi\n")
    assert code == 0, err
    code, _, err = run_piped(monkeypatch, model, "-m", str(tmp_path / "other.gguf"), stdin="")
    assert_one_line_error(code, err, 2, "two models given")
    environ = {"LLAMA_ARG_MODEL": str(tmp_path / "other.gguf")}
    code, _, err = run_piped(monkeypatch, model, "-n", "1", stdin="hi\n", environ=environ)
    assert code == 0, err
    code, _, err = run_piped(monkeypatch, str(tmp_path / "missing.gguf"), stdin="")
    assert_one_line_error(code, err, 1, "model not found")


def test_a_message_with_undecodable_bytes_is_not_sent(monkeypatch, tiny_gguf):
    code, out, err = run_piped(monkeypatch, str(tiny_gguf), "-n", "1", stdin="\udcff\nhi\n")
    assert code == 1
    assert "the message is not valid UTF-8 text" in err and "it was not sent" in err
    assert out.count("\n") == 1


def test_a_message_the_template_cannot_render_is_not_sent(monkeypatch, tiny_gguf):
    argv = (str(tiny_gguf), "--chat-template", "{{ 1 / 0 }}")
    code, out, err = run_piped(monkeypatch, *argv, stdin="hi\n/exit\n")
    assert code == 1 and out == ""
    assert "the chat template cannot render these messages" in err and "not sent" in err


def test_input_that_is_not_utf8_is_one_line(monkeypatch, tiny_gguf):
    stdin = io.TextIOWrapper(io.BytesIO(b"\xff\xfe hello\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    code, _, err = run_cli("run", str(tiny_gguf), "-n", "1", "-c", "256")
    assert_one_line_error(code, err, 1, "the input is not valid UTF-8 text")


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (("-n", "-3"), 2, "-n/--n-predict"),
        (("--top-p", "1.5"), 2, "--top-p: top_p must be"),
        (("--chat-template", "nonsense"), 2, "chatml"),
        (("-p", "\udcff"), 1, "not valid UTF-8"),
        (("-p", "hi", "--chat-template", "{{ 1 / 0 }}"), 1, "chat template cannot render"),
    ],
)
def test_bad_flags_get_one_line(monkeypatch, tiny_gguf, argv, code, message):
    result = run_piped(monkeypatch, str(tiny_gguf), *argv, stdin="")
    assert_one_line_error(result[0], result[2], code, message)


def test_history_lives_in_the_cache_directory(tmp_path):
    assert history_path({"MLXCEL_CACHE_DIR": str(tmp_path)}) == tmp_path / "run_history"
    assert history_path({}).parts[-3:] == (".cache", "mlxcel", "run_history")
