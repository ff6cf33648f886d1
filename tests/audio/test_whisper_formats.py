"""format_transcription: the bodies and content types of OpenAI's response formats."""

from __future__ import annotations

import json

import pytest

from mlxcel_audio.errors import AudioInputError
from mlxcel_audio.formats import format_transcription
from mlxcel_audio.whisper import Segment, Transcription


def segment(id_: int, start: float, end: float, text: str) -> Segment:
    return Segment(id=id_, start=start, end=end, text=text, tokens=(1, 2), temperature=0.0,
                   avg_logprob=-0.2, compression_ratio=1.1, no_speech_prob=0.01)  # fmt: skip


TRANSCRIPTION = Transcription(
    text="Hello world. Again, an hour later.",
    language="en",
    duration=3725.5,
    segments=(
        segment(0, 0.0, 1.5, " Hello world."),
        segment(1, 3723.25, 3725.5, " Again, an hour later."),
    ),
)


def test_text_and_json():
    assert format_transcription(TRANSCRIPTION, "text") == (
        "Hello world. Again, an hour later.\n",
        "text/plain; charset=utf-8",
    )
    body, content_type = format_transcription(TRANSCRIPTION, "json")
    assert json.loads(body) == {"text": TRANSCRIPTION.text}
    assert content_type == "application/json"


def test_srt_numbers_cues_with_comma_milliseconds():
    body, content_type = format_transcription(TRANSCRIPTION, "srt")
    assert content_type == "application/x-subrip; charset=utf-8"
    assert body == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello world.\n\n"
        "2\n01:02:03,250 --> 01:02:05,500\nAgain, an hour later.\n"
    )


def test_vtt_has_a_header_and_dot_milliseconds():
    body, content_type = format_transcription(TRANSCRIPTION, "vtt")
    assert content_type == "text/vtt; charset=utf-8"
    assert body == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello world.\n\n"
        "01:02:03.250 --> 01:02:05.500\nAgain, an hour later.\n"
    )


def test_verbose_json_has_segments_and_the_language_name():
    body, _ = format_transcription(TRANSCRIPTION, "verbose_json", task="translate")
    data = json.loads(body)
    assert data["task"] == "translate" and data["language"] == "english"
    assert data["duration"] == 3725.5 and data["text"] == TRANSCRIPTION.text
    assert [s["start"] for s in data["segments"]] == [0.0, 3723.25]
    assert set(data["segments"][0]) == {
        "id", "start", "end", "text", "tokens", "temperature", "avg_logprob",
        "compression_ratio", "no_speech_prob",
    }  # fmt: skip


def test_unknown_formats_are_refused():
    with pytest.raises(AudioInputError, match="response_format must be one of"):
        format_transcription(TRANSCRIPTION, "xml")
