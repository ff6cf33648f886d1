"""A transcript in each of OpenAI's `response_format`s: json, text, srt, vtt, verbose_json.

Content types: `application/json` for the JSON formats, `text/vtt; charset=utf-8` for WebVTT
(its registered type, which browsers' `<track>` elements require), and
`text/plain; charset=utf-8` for text and SRT (as OpenAI's API answers).
"""

from __future__ import annotations

import json
from collections.abc import Collection

from mlxcel_server.audio_models import Transcript

TRANSCRIPT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_VTT = "text/vtt; charset=utf-8"


def _timestamp(seconds: float, decimal_marker: str) -> str:
    milliseconds = round(max(seconds, 0.0) * 1000)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds_part, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds_part:02d}{decimal_marker}{milliseconds:03d}"


def _srt(transcript: Transcript) -> str:
    cues = [
        f"{number}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{s.text.strip()}\n"
        for number, s in enumerate(transcript.segments, start=1)
    ]
    return "\n".join(cues)


def _vtt(transcript: Transcript) -> str:
    cues = [
        f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{s.text.strip()}\n"
        for s in transcript.segments
    ]
    return "\n".join(["WEBVTT\n", *cues])


def _verbose(transcript: Transcript, task: str, granularities: Collection[str]) -> dict:
    body: dict = {
        "task": task,
        "language": transcript.language,
        "duration": transcript.duration,
        "text": transcript.text,
    }
    if "word" in granularities:
        body["words"] = [
            {"word": w.word.strip(), "start": w.start, "end": w.end}
            for s in transcript.segments
            for w in s.words
        ]
    if "segment" in granularities or not granularities:
        body["segments"] = [
            {
                "id": s.id,
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "tokens": list(s.tokens),
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            }
            for s in transcript.segments
        ]
    return body


def format_transcript(
    transcript: Transcript,
    response_format: str,
    task: str,
    granularities: Collection[str] = ("segment",),
) -> tuple[str, str]:
    """The response body and its content type.

    Args:
        transcript: what the model heard.
        response_format: one of `TRANSCRIPT_FORMATS`.
        task: "transcribe" or "translate", reported by verbose_json.
        granularities: of `GRANULARITIES`, the timestamps verbose_json lists: `segments`
            for "segment" (or none given), a top-level `words` list for "word".

    Raises:
        ValueError: `response_format` is not one of `TRANSCRIPT_FORMATS`.
    """
    if response_format == "json":
        return json.dumps({"text": transcript.text}, ensure_ascii=False), _JSON
    if response_format == "verbose_json":
        return json.dumps(_verbose(transcript, task, granularities), ensure_ascii=False), _JSON
    if response_format == "text":
        return transcript.text + "\n", _TEXT
    if response_format == "srt":
        return _srt(transcript), _TEXT
    if response_format == "vtt":
        return _vtt(transcript), _VTT
    raise ValueError(f"response_format must be one of {', '.join(TRANSCRIPT_FORMATS)}")
