"""OpenAI's audio endpoints: `POST /v1/audio/transcriptions`, `/v1/audio/translations` and
`/v1/audio/speech` (and unversioned).

Each handler validates the request, then hands the speech work to the audio worker (a 503
with Retry-After when its queue is full) and answers from what it returns. Without a model
for an endpoint, it answers 501 naming the flag that loads one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import TypeVar

import numpy as np
from quart import Blueprint, Response, request
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import RequestEntityTooLarge

from mlxcel_server.audio_models import (
    STT_ALIASES,
    TTS_ALIASES,
    ServingAudio,
    SpeechToText,
    TextToSpeech,
    Transcript,
    TranscriptionRequest,
    answers_to,
)
from mlxcel_server.audio_speech import (
    SpeechRequest,
    audio_stream,
    check_format,
    choose_speaker,
    mime_type,
    sse_stream,
)
from mlxcel_server.audio_transcript_formats import (
    GRANULARITIES,
    TRANSCRIPT_FORMATS,
    format_transcript,
)
from mlxcel_server.audio_worker import AudioOverloadedError, AudioWorkerClosedError
from mlxcel_server.errors import ApiError, invalid
from mlxcel_server.settings import ServerSettings
from mlxcel_server.state import ServerState
from mlxcel_server.validation import parse_body

T = TypeVar("T")

# The multipart fields a transcription takes; OpenAI's others (`stream`, `include[]`,
# `chunking_strategy`) and misspelt ones get a 400 rather than being ignored.
TRANSCRIPTION_FIELDS = frozenset(
    {
        "file",
        "model",
        "language",
        "prompt",
        "temperature",
        "response_format",
        "timestamp_granularities[]",
        "timestamp_granularities",
    }
)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the audio upload is larger than {limit} bytes (--audio-max-bytes)")


def _not_served(audio: ServingAudio | None, flag: str) -> ApiError:
    served = (
        "no audio model is loaded"
        if audio is None
        else f"this server serves only {', '.join(audio.model_names)}"
    )
    return ApiError(
        501,
        f"{request.path} needs another model: {served}; start it with {flag} "
        "(speech models need mlxcel's audio extra)",
        code="not_implemented",
    )


def _check_model_name(
    model: SpeechToText | TextToSpeech, aliases: tuple[str, ...], name: str | None
) -> None:
    if name and not answers_to(model, aliases, name):
        raise ApiError(
            404,
            f"the model {name!r} does not exist; this server serves {model.name!r} "
            f"(also called {', '.join(repr(a) for a in aliases)}) here",
            param="model",
            code="model_not_found",
        )


def _submit(audio: ServingAudio, work: Callable[[], Iterator[T]]) -> AsyncGenerator[T, None]:
    try:
        return audio.worker.submit(work)
    except AudioOverloadedError as error:
        raise ApiError(
            503, str(error), headers={"Retry-After": str(error.retry_after_seconds)}
        ) from error
    except AudioWorkerClosedError as error:
        raise ApiError(503, str(error)) from error


def _temperature(form: MultiDict) -> float | None:
    text = form.get("temperature")
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise invalid(f"temperature must be a number in [0, 1], got {text!r}", "temperature")
    return value


def _granularities(form: MultiDict, response_format: str) -> tuple[str, ...]:
    given = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    for granularity in given:
        if granularity not in GRANULARITIES:
            raise invalid(
                f"timestamp_granularities: {granularity!r} is not one of segment, word",
                "timestamp_granularities",
            )
    if "word" in given and response_format != "verbose_json":
        raise invalid(
            "timestamp_granularities: word timestamps need response_format verbose_json, "
            f"got {response_format!r}",
            "timestamp_granularities",
        )
    return tuple(given)


async def _read_upload(settings: ServerSettings) -> tuple[bytes, MultiDict]:
    try:
        files = await request.files
        form = await request.form
    except RequestEntityTooLarge as error:
        raise _too_large(settings.audio_max_bytes) from error
    for field in (*form.keys(), *files.keys()):
        if field not in TRANSCRIPTION_FIELDS:
            raise invalid(f"unsupported parameter {field!r}: mlxcel does not implement it", field)
    upload = files.get("file")
    if upload is None:
        raise invalid("file is required: send the audio as the multipart field 'file'", "file")
    data = upload.read()
    if not data:
        raise invalid("file is empty", "file")
    return data, form


def _transcription_work(
    audio: ServingAudio, stt: SpeechToText, data: bytes, options: TranscriptionRequest
) -> Callable[[], Iterator[Transcript]]:
    endpoint = "translations" if options.task == "translate" else "transcriptions"

    def work() -> Iterator[Transcript]:
        started = time.perf_counter()
        transcript = stt.transcribe(data, options)
        audio.totals.record(
            endpoint,
            "transcribed",
            audio_seconds=transcript.duration,
            processing_seconds=time.perf_counter() - started,
        )
        yield transcript

    return work


def speech_work(
    audio: ServingAudio, tts: TextToSpeech, text: str, speaker: str | None, speed: float
) -> Callable[[], Iterator[np.ndarray]]:
    """The worker's job for one speech request: `text` spoken sentence by sentence (long ones
    in pieces), counted in `audio.totals` when it ends, finished or abandoned."""

    def work() -> Iterator[np.ndarray]:
        started = time.perf_counter()
        num_samples = 0
        try:
            for samples in tts.synthesize(text, speaker=speaker, speed=speed):
                num_samples += len(samples)
                yield samples
        finally:  # a stream the client abandoned counts as far as it was spoken
            audio.totals.record(
                "speech",
                "synthesized",
                audio_seconds=num_samples / tts.sample_rate,
                processing_seconds=time.perf_counter() - started,
            )

    return work


async def _prepend(
    first: np.ndarray, rest: AsyncGenerator[np.ndarray, None]
) -> AsyncIterator[np.ndarray]:
    try:
        yield first
        async for samples in rest:
            yield samples
    finally:
        await rest.aclose()


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("audio", __name__)

    async def transcribe(task: str) -> Response:
        audio = state.audio
        if audio is None or audio.stt is None:
            raise _not_served(audio, "--stt-model PATH")
        data, form = await _read_upload(settings)
        _check_model_name(audio.stt, STT_ALIASES, form.get("model"))
        response_format = form.get("response_format") or "json"
        if response_format not in TRANSCRIPT_FORMATS:
            raise invalid(
                f"response_format must be one of {', '.join(TRANSCRIPT_FORMATS)}, "
                f"got {response_format!r}",
                "response_format",
            )
        granularities = _granularities(form, response_format)
        options = TranscriptionRequest(
            task="translate" if task == "translate" else "transcribe",
            language=form.get("language") or None,
            prompt=form.get("prompt") or None,
            temperature=_temperature(form),
            word_timestamps="word" in granularities,
        )
        results = _submit(audio, _transcription_work(audio, audio.stt, data, options))
        try:
            transcript = await anext(results)
        except ValueError as error:
            raise invalid(str(error)) from error
        finally:
            await results.aclose()
        body, content_type = format_transcript(transcript, response_format, task, granularities)
        return Response(body, content_type=content_type)

    async def transcriptions() -> Response:
        return await transcribe("transcribe")

    async def translations() -> Response:
        return await transcribe("translate")

    async def speech() -> Response:
        audio = state.audio
        if audio is None or audio.tts is None:
            raise _not_served(audio, "--tts-model PATH")
        body = await parse_body(SpeechRequest)
        voice = audio.tts
        _check_model_name(voice, TTS_ALIASES, body.model)
        check_format(voice, body.response_format)
        speaker = choose_speaker(voice, body.voice)
        if not body.input.strip():
            raise invalid("input holds no text to speak", "input")
        spoken = _submit(audio, speech_work(audio, voice, body.input, speaker, body.speed))
        # The first sentence is awaited before answering, so text the voice cannot speak
        # is a 400 rather than a cut-off 200.
        try:
            first = await anext(spoken)
        except ValueError as error:
            await spoken.aclose()
            raise invalid(str(error), "input") from error
        sentences = _prepend(first, spoken)
        if body.stream_format == "sse":
            chunks = sse_stream(voice, sentences, body.response_format)
            response = Response(chunks, content_type="text/event-stream")
        else:
            chunks = audio_stream(voice, sentences, body.response_format)
            response = Response(chunks, content_type=mime_type(body.response_format))
        # Speaking a long input may take longer than Quart's default response timeout.
        response.timeout = None
        return response

    for name, handler in (
        ("transcriptions", transcriptions),
        ("translations", translations),
        ("speech", speech),
    ):
        blueprint.add_url_rule(f"/v1/audio/{name}", name, handler, methods=["POST"])
        blueprint.add_url_rule(f"/audio/{name}", f"{name}_unversioned", handler, methods=["POST"])
    return blueprint
