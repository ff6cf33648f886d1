"""The audio endpoints on fake speech models: formats, content types and error statuses."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, replace

import numpy as np
import pytest
import soundfile
from audio_app import AudioApps, upload
from audio_fakes import HEARD, FakeSegment, FakeSpeechToText, FakeVoice, mp3_bytes, wav_bytes

from mlxcel_server.audio_models import TranscriptionRequest


@pytest.fixture(scope="module")
def apps(tiny_loaded):
    apps = AudioApps(tiny_loaded)
    yield apps
    apps.close()


@pytest.fixture(scope="module")
def client(apps):
    client, _ = apps.make(stt=FakeSpeechToText(), tts=FakeVoice())
    return client


def test_json_is_the_default_format(client):
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(), model="whisper-1"))
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json() == {"text": HEARD}


def test_unversioned_path_and_the_model_name_work(client):
    reply = client.post("/audio/transcriptions", **upload(wav_bytes(), model="whisper-fake.en"))
    assert reply.status == 200
    assert reply.json()["text"] == HEARD


def test_text_format_is_plain_text(client):
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(), response_format="text"))
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.body.decode() == HEARD + "\n"


def test_srt_numbers_cues_with_comma_times(client):
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(2.0), response_format="srt"))
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert reply.body.decode() == (
        "1\n00:00:00,000 --> 00:00:01,000\nHello world,\n\n"
        "2\n00:00:01,000 --> 00:00:02,000\nthis is a test.\n"
    )


def test_vtt_has_its_header_and_dot_times(client):
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(2.0), response_format="vtt"))
    assert reply.headers["Content-Type"] == "text/vtt; charset=utf-8"
    assert reply.body.decode() == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nHello world,\n\n"
        "00:00:01.000 --> 00:00:02.000\nthis is a test.\n"
    )


def test_verbose_json_has_openai_fields(client):
    form = {"response_format": "verbose_json", "timestamp_granularities[]": "segment"}
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(1.5), **form))
    body = reply.json()
    assert body["task"] == "transcribe"
    assert body["language"] == "english"
    assert body["duration"] == pytest.approx(1.5)
    assert body["text"] == HEARD
    assert [s["id"] for s in body["segments"]] == [0, 1]
    assert set(body["segments"][0]) == {
        "id", "start", "end", "text", "tokens", "temperature", "avg_logprob",
        "compression_ratio", "no_speech_prob",
    }  # fmt: skip


@dataclass(frozen=True)
class FakeWord:
    word: str
    start: float
    end: float


@dataclass(frozen=True)
class WordedSegment(FakeSegment):
    words: tuple[FakeWord, ...] = ()


class WordedSpeechToText(FakeSpeechToText):
    """The fake model, timing each word of a segment evenly across it when asked."""

    def transcribe(self, upload: bytes, request: TranscriptionRequest):
        transcript = super().transcribe(upload, request)
        segments = []
        for segment in transcript.segments:
            texts = segment.text.split()
            step = (segment.end - segment.start) / len(texts)
            words = tuple(
                FakeWord(" " + text, segment.start + i * step, segment.start + (i + 1) * step)
                for i, text in enumerate(texts)
            )
            fields = {k: getattr(segment, k) for k in FakeSegment.__dataclass_fields__}
            segments.append(WordedSegment(**fields, words=words if request.word_timestamps else ()))
        return replace(transcript, segments=tuple(segments))


def _with_granularities(granularities: list[str], response_format: str) -> dict:
    # The test client sends one value per field, so a second granularity goes in the
    # field's other accepted spelling.
    names = ("timestamp_granularities[]", "timestamp_granularities")
    form = dict(zip(names, granularities, strict=False))
    return upload(wav_bytes(2.0), response_format=response_format, **form)


def test_word_granularity_adds_openais_words_list(apps):
    stt = WordedSpeechToText()
    client, _ = apps.make(stt=stt)
    both = client.post(
        "/v1/audio/transcriptions", **_with_granularities(["word", "segment"], "verbose_json")
    )
    assert both.status == 200
    body = both.json()
    assert stt.requests[-1].word_timestamps
    assert [w["word"] for w in body["words"]] == HEARD.split()
    assert body["words"][0] == {"word": "Hello", "start": 0.0, "end": 0.5}
    assert [s["id"] for s in body["segments"]] == [0, 1]
    only_words = client.post(
        "/v1/audio/transcriptions", **_with_granularities(["word"], "verbose_json")
    ).json()
    assert "segments" not in only_words and len(only_words["words"]) == 6
    segments = client.post(
        "/v1/audio/transcriptions", **_with_granularities(["segment"], "verbose_json")
    ).json()
    assert not stt.requests[-1].word_timestamps
    assert "words" not in segments and len(segments["segments"]) == 2


def test_word_granularity_without_verbose_json_gets_400(client):
    reply = client.post("/v1/audio/transcriptions", **_with_granularities(["word"], "srt"))
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["param"] == "timestamp_granularities"
    assert "need response_format verbose_json" in error["message"]


def test_fields_reach_the_model(apps):
    stt = FakeSpeechToText()
    client, _ = apps.make(stt=stt)
    form = {"language": "en", "prompt": "Names: Ana.", "temperature": "0.2"}
    assert client.post("/v1/audio/transcriptions", **upload(wav_bytes(), **form)).status == 200
    request = stt.requests[0]
    assert (request.task, request.language, request.prompt, request.temperature) == (
        "transcribe", "en", "Names: Ana.", 0.2,
    )  # fmt: skip


def test_an_upload_named_blob_works(client):
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(), filename="blob"))
    assert reply.status == 200


@pytest.mark.parametrize(
    ("data", "filename"),
    [
        (mp3_bytes()[: len(mp3_bytes()) // 8], "clip.mp3"),
        (b"this is a text file, not a sound\n" * 20, "notes.wav"),
    ],
    ids=["truncated-mp3", "text-named-wav"],
)
def test_unusable_uploads_get_400_with_the_decoder_message(client, data, filename):
    reply = client.post("/v1/audio/transcriptions", **upload(data, filename=filename))
    assert reply.status == 400
    assert "not audio" in reply.json()["error"]["message"]


def test_an_empty_file_gets_400(client):
    reply = client.post("/v1/audio/transcriptions", **upload(b""))
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "file"


def test_a_missing_file_gets_400(client):
    reply = client.post("/v1/audio/transcriptions", form={"model": "whisper-1"})
    assert reply.status == 400
    assert "file is required" in reply.json()["error"]["message"]


def test_an_upload_over_the_limit_gets_413(apps):
    client, _ = apps.make(stt=FakeSpeechToText(), audio_max_bytes=20_000)
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(1.0)))
    assert reply.status == 413
    assert "20000 bytes" in reply.json()["error"]["message"]


def test_the_audio_limit_leaves_the_text_routes_limit_alone(apps):
    client, _ = apps.make(stt=FakeSpeechToText(), max_body_bytes=100)
    assert client.post("/v1/audio/transcriptions", **upload(wav_bytes(1.0))).status == 200
    long_prompt = {"prompt": "x" * 200, "max_tokens": 1}
    reply = client.post("/v1/completions", json=long_prompt)
    assert reply.status == 413


def test_translation_on_an_english_only_model_gets_400(client):
    reply = client.post("/v1/audio/translations", **upload(wav_bytes()))
    assert reply.status == 400
    assert "English-only" in reply.json()["error"]["message"]


def test_an_unknown_model_gets_404(client):
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(), model="whisper-large"))
    assert reply.status == 404
    assert reply.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ({"response_format": "xml"}, "response_format"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": "1.5"}, "temperature"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),
        ({"stream": "true"}, "stream"),
        ({"langauge": "en"}, "langauge"),
    ],
)
def test_bad_fields_get_400_naming_them(client, form, param):
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes(), **form))
    assert reply.status == 400
    assert reply.json()["error"]["param"] == param


def _speech(client, **body):
    return client.post("/v1/audio/speech", json={"input": "Hello there. How are you?", **body})


def test_speech_defaults_to_mp3(client):
    reply = _speech(client, model="tts-1", voice="alloy")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "audio/mpeg"
    samples, rate = soundfile.read(io.BytesIO(reply.body))
    assert rate == 22_050
    assert len(samples) / rate == pytest.approx(0.5, abs=0.1)


@pytest.mark.parametrize(
    ("audio_format", "content_type"),
    [("wav", "audio/wav"), ("flac", "audio/flac")],
)
def test_speech_formats_decode_to_every_sentence(client, audio_format, content_type):
    reply = _speech(client, response_format=audio_format, voice="en_US-fake-medium")
    assert reply.headers["Content-Type"] == content_type
    samples, rate = soundfile.read(io.BytesIO(reply.body), dtype="float32")
    assert rate == 22_050
    assert len(samples) == 2 * int(22_050 * 0.25)


def test_pcm_is_raw_16_bit_samples(client):
    reply = _speech(client, response_format="pcm", speed=2.0)
    assert reply.headers["Content-Type"] == "audio/pcm"
    samples = np.frombuffer(reply.body, dtype="<i2")
    assert len(samples) == 2 * int(22_050 * 0.25 / 2.0)
    assert 0.4 < np.abs(samples).max() / 32767 < 0.6


def test_sse_sends_each_sentence_then_done(client):
    reply = _speech(client, response_format="pcm", stream_format="sse")
    assert reply.headers["Content-Type"] == "text/event-stream"
    events = [json.loads(b[6:]) for b in reply.body.decode().split("\n\n") if b]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 2 + ["speech.audio.done"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"input": "Hi.", "speed": 4.5}, "speed"),
        ({"input": "Hi.", "voice": "bob"}, "voice"),
        ({"input": "Hi.", "response_format": "opus"}, "response_format"),
        ({"input": "Hi.", "response_format": "ogg"}, "response_format"),
        ({"input": "Hi.", "stream_format": "chunks"}, "stream_format"),
        ({"input": "...!"}, "input"),
    ],
)
def test_bad_speech_requests_get_400_naming_the_field(client, body, param):
    reply = client.post("/v1/audio/speech", json=body)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == param


def test_a_multi_speaker_voice_takes_its_speaker_names(apps):
    client, _ = apps.make(tts=FakeVoice(speakers=("amy", "bob")))
    assert _speech(client, voice="bob").status == 200
    assert _speech(client, voice="1").status == 200
    assert _speech(client, voice="alloy").status == 400


# "\u0661" and "\uff11" are digits one of other scripts, which int() reads as 1.
@pytest.mark.parametrize("voice", ["\u0661", "\uff11", "2", "-1", "1.0"])
def test_a_speaker_id_is_ascii_decimal_below_the_speaker_count(apps, voice):
    client, _ = apps.make(tts=FakeVoice(speakers=("amy", "bob")))
    reply = _speech(client, voice=voice)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "voice"


def test_unserved_endpoints_answer_501_naming_the_flag(apps):
    client, _ = apps.make()
    reply = client.post("/v1/audio/transcriptions", **upload(wav_bytes()))
    assert reply.status == 501
    assert "--stt-model" in reply.json()["error"]["message"]
    assert "audio extra" in reply.json()["error"]["message"]
    client, _ = apps.make(stt=FakeSpeechToText())
    reply = _speech(client)
    assert reply.status == 501
    assert "--tts-model" in reply.json()["error"]["message"]


def test_models_and_health_list_the_speech_models(client):
    ids = [entry["id"] for entry in client.get("/v1/models").json()["data"]]
    assert ids == ["tiny", "whisper-fake.en", "en_US-fake-medium"]
    health = client.get("/health").json()
    assert health == {"status": "ok", "audio_models": ["whisper-fake.en", "en_US-fake-medium"]}


def test_a_speed_that_is_not_a_number_is_named_as_such(client):
    # Python's json module writes NaN, and the server's parser reads it back.
    reply = client.post("/v1/audio/speech", json={"input": "Hi.", "speed": float("nan")})
    assert reply.status == 400
    assert reply.json()["error"] == {
        "code": None,
        "message": "speed: Input should be a finite number",
        "param": "speed",
        "type": "invalid_request_error",
    }
