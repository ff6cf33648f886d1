"""The speech issue's cases on a real `mlxcel serve` with the audio extra's models (Whisper
tiny.en, the Piper voice en_US-joe-medium), through the official `openai` client.

Round trip: what the server says, it hears back (word error rate at most 10%); the same clip
in other containers transcribes to the same words; the text formats have their shapes.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import av
import numpy as np
import openai
import pytest
import soundfile

from live_server import LiveServer
from word_errors import word_error_rate

pytestmark = [pytest.mark.slow, pytest.mark.long]

HELLO = "hello world, this is a test"
LONGER = (
    "The quick brown fox jumps over the lazy dog near the riverbank. "
    "Scientists discovered a new species of butterfly in the tropical rainforest. "
    "Please remember to bring your umbrella because it might rain this afternoon."
)
MAX_WORD_ERROR_RATE = 0.10


def _encode_with_pyav(samples: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as output:
        stream = output.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            output.mux(packet)
        for packet in stream.encode(None):
            output.mux(packet)
    return buffer.getvalue()


def _encode_with_soundfile(samples: np.ndarray, rate: int, container: str, subtype: str) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=container, subtype=subtype)
    return buffer.getvalue()


def transcode(wav: bytes, extension: str) -> bytes:
    """`wav` as a file of `extension`: mp3, flac, ogg (Vorbis), m4a and mp4 (AAC), webm (Opus)."""
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    if extension == "mp3":
        return _encode_with_soundfile(samples, rate, "MP3", "MPEG_LAYER_III")
    if extension == "flac":
        return _encode_with_soundfile(samples, rate, "FLAC", "PCM_16")
    if extension == "ogg":
        return _encode_with_soundfile(samples, rate, "OGG", "VORBIS")
    if extension == "webm":
        # Opus runs at 48 kHz.
        resampled = np.interp(
            np.arange(len(samples) * 48_000 // rate) * rate / 48_000,
            np.arange(len(samples)),
            samples,
        ).astype(np.float32)
        return _encode_with_pyav(resampled, 48_000, "webm", "libopus")
    container = {"m4a": "ipod", "mp4": "mp4"}[extension]
    return _encode_with_pyav(samples, rate, container, "aac")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    server = LiveServer("-c", "256", audio=True)
    yield server
    assert server.stop() == 0, server.stderr()


@pytest.fixture
def client(server) -> Iterator[openai.OpenAI]:
    with server.stderr_on_failure():
        yield server.client(timeout=120)


@pytest.fixture(scope="module")
def hello_wav(server) -> bytes:
    speech = server.client(timeout=120).audio.speech.create(
        model="tts-1", voice="alloy", input=HELLO, response_format="wav"
    )
    return speech.content


def test_round_trip_hello(client, hello_wav):
    heard = client.audio.transcriptions.create(model="whisper-1", file=("hello.wav", hello_wav))
    assert word_error_rate(HELLO, heard.text) <= MAX_WORD_ERROR_RATE, heard.text


def test_round_trip_three_longer_sentences_as_mp3(client):
    speech = client.audio.speech.create(model="tts-1", voice="en_US-joe-medium", input=LONGER)
    assert speech.response.headers["content-type"] == "audio/mpeg"
    heard = client.audio.transcriptions.create(
        model="whisper-tiny.en", file=("speech.mp3", speech.content)
    )
    assert word_error_rate(LONGER, heard.text) <= MAX_WORD_ERROR_RATE, heard.text


@pytest.mark.parametrize("extension", ["mp3", "flac", "ogg", "m4a", "mp4", "webm"])
def test_every_container_transcribes_to_the_same_words(client, hello_wav, extension):
    data = transcode(hello_wav, extension)
    heard = client.audio.transcriptions.create(model="whisper-1", file=(f"hello.{extension}", data))
    assert word_error_rate(HELLO, heard.text) <= MAX_WORD_ERROR_RATE, heard.text


def test_an_upload_named_blob_transcribes(client, hello_wav):
    heard = client.audio.transcriptions.create(model="whisper-1", file=("blob", hello_wav))
    assert word_error_rate(HELLO, heard.text) <= MAX_WORD_ERROR_RATE, heard.text


def test_text_srt_vtt_and_verbose_json_through_the_client(client, hello_wav):
    def ask(response_format: str):
        return client.audio.transcriptions.create(
            model="whisper-1", file=("hello.wav", hello_wav), response_format=response_format
        )

    text = ask("text")
    assert isinstance(text, str) and word_error_rate(HELLO, text) <= MAX_WORD_ERROR_RATE
    srt = ask("srt")
    assert re.match(r"1\n00:00:00,000 --> 00:00:0\d,\d{3}\n\S", srt), srt
    vtt = ask("vtt")
    assert re.match(r"WEBVTT\n\n00:00:00\.000 --> 00:00:0\d\.\d{3}\n\S", vtt), vtt
    verbose = ask("verbose_json")
    assert verbose.language == "english"
    assert 1.0 < verbose.duration < 5.0
    assert verbose.segments and verbose.segments[-1].end <= verbose.duration + 0.5
    assert word_error_rate(HELLO, verbose.text) <= MAX_WORD_ERROR_RATE


@pytest.mark.parametrize(
    ("data", "filename", "status"),
    [
        (b"", "empty.wav", 400),
        (b"this is a text file, not a sound\n" * 20, "notes.wav", 400),
        (None, "cut.mp3", 400),
    ],
    ids=["empty", "text-named-wav", "truncated-mp3"],
)
def test_bad_uploads_are_json_errors(client, hello_wav, data, filename, status):
    if data is None:
        whole = transcode(hello_wav, "mp3")
        data = whole[: len(whole) // 10]
    with pytest.raises(openai.APIStatusError) as raised:
        client.audio.transcriptions.create(model="whisper-1", file=(filename, data))
    assert raised.value.status_code == status
    assert raised.value.response.json()["error"]["type"] == "invalid_request_error"


def test_translation_on_the_english_only_model_is_a_400(client, hello_wav):
    with pytest.raises(openai.BadRequestError, match="English"):
        client.audio.translations.create(model="whisper-1", file=("hello.wav", hello_wav))


def test_an_upload_over_the_limit_is_a_413(client):
    too_large = b"\0" * (25 * 2**20 + 1)
    with pytest.raises(openai.APIStatusError) as raised:
        client.audio.transcriptions.create(model="whisper-1", file=("big.wav", too_large))
    assert raised.value.status_code == 413
