"""A transcription as the response formats of OpenAI's audio API: text, json,
verbose_json, srt and vtt."""

from __future__ import annotations

import json

from mlxcel_audio.errors import AudioInputError
from mlxcel_audio.whisper.languages import LANGUAGES
from mlxcel_audio.whisper.transcribe import Segment, Transcription

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
_CONTENT_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def format_transcription(
    transcription: Transcription, response_format: str, *, task: str = "transcribe"
) -> tuple[str, str]:
    """The response body and its content type.

    Args:
        response_format: one of RESPONSE_FORMATS.
        task: "transcribe" or "translate", reported by verbose_json.

    Raises:
        AudioInputError: an unknown response format.
    """
    if response_format not in _CONTENT_TYPES:
        raise AudioInputError(
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}"
        )
    content_type = _CONTENT_TYPES[response_format]
    if response_format == "json":
        return json.dumps({"text": transcription.text}, ensure_ascii=False), content_type
    if response_format == "verbose_json":
        return json.dumps(_verbose(transcription, task), ensure_ascii=False), content_type
    if response_format == "text":
        return transcription.text + "\n", content_type
    if response_format == "srt":
        cues = [
            f"{i}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{s.text.strip()}\n"
            for i, s in enumerate(transcription.segments, 1)
        ]
        return "\n".join(cues), content_type
    cues = [
        f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{s.text.strip()}\n"
        for s in transcription.segments
    ]
    return "WEBVTT\n\n" + "\n".join(cues), content_type


def _verbose(transcription: Transcription, task: str) -> dict[str, object]:
    return {
        "task": task,
        "language": LANGUAGES.get(transcription.language, transcription.language),
        "duration": round(transcription.duration, 3),
        "text": transcription.text,
        "segments": [_segment(segment) for segment in transcription.segments],
    }


def _segment(segment: Segment) -> dict[str, object]:
    return {
        "id": segment.id,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": list(segment.tokens),
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def _timestamp(seconds: float, decimal_marker: str) -> str:
    """HH:MM:SS,mmm (SubRip) or HH:MM:SS.mmm (WebVTT)."""
    milliseconds = round(seconds * 1000)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"
