"""`mlxcel transcribe` through `main`: each response format, and one-line errors."""

from __future__ import annotations

import io
import json

import pytest
import soundfile
from speech_clips import HELLO, SAMPLE_RATE, speech

from mlxcel.cli import main


@pytest.fixture(scope="module")
def hello_wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("audio") / "hello.wav"
    soundfile.write(path, speech(HELLO), SAMPLE_RATE)
    return path


def run(*argv: str, environ: dict | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["transcribe", *argv], environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
@pytest.mark.long
def test_every_response_format(hello_wav, tiny_en_path):
    outputs = {}
    for response_format in ("text", "verbose_json", "srt", "vtt"):
        code, out, err = run(str(hello_wav), "-m", str(tiny_en_path), "--response-format",
                             response_format)  # fmt: skip
        assert (code, err) == (0, "")
        outputs[response_format] = out
    # json through its environment mirror, with the default model
    code, outputs["json"], err = run(str(hello_wav), environ={"MLXCEL_STT_RESPONSE_FORMAT": "json"})
    assert (code, err) == (0, "")
    assert outputs["text"] == HELLO + "\n"
    assert json.loads(outputs["json"]) == {"text": HELLO}
    verbose = json.loads(outputs["verbose_json"])
    assert verbose["language"] == "english" and verbose["text"] == HELLO
    assert verbose["segments"][0]["start"] == 0.0
    assert 1.5 < verbose["segments"][-1]["end"] <= verbose["duration"] + 0.5
    assert outputs["srt"].startswith("1\n00:00:00,000 --> 00:00:0") and HELLO in outputs["srt"]
    assert (
        outputs["vtt"].startswith("WEBVTT\n\n00:00:00.000 --> 00:00:0") and HELLO in outputs["vtt"]
    )


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--task", "translate"], 1, "English-only: it cannot translate"),
        (["--response-format", "xml"], 2, "--response-format must be one of"),
        (["--temperature", "3"], 2, "temperature must be between 0 and 1"),
        (["--temperature", "warm"], 2, "--temperature: expected a number, got 'warm'"),
        (["--language", "klingon"], 2, "unknown language"),
    ],
)
def test_bad_flags_give_one_line_errors(hello_wav, argv, code, message):
    result, out, err = run(str(hello_wav), *argv)
    assert result == code and out == ""
    assert message in err and err.count("\n") == 1


def test_bad_files_give_one_line_errors(tmp_path):
    text = tmp_path / "notes.wav"
    text.write_text("not a recording\n" * 10)
    empty = tmp_path / "empty.mp3"
    empty.write_bytes(b"")
    for path, message in ((text, "not audio"), (empty, "empty"),
                          (tmp_path / "missing.wav", "cannot read")):  # fmt: skip
        code, out, err = run(str(path))
        assert code == 1 and out == ""
        assert message in err and err.startswith("mlxcel: error: ") and err.count("\n") == 1
