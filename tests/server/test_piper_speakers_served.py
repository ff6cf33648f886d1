"""`POST /v1/audio/speech`'s `voice` picking a speaker of the small multi-speaker Piper
voice (tests/audio/data), by name or id."""

from __future__ import annotations

from pathlib import Path

import pytest
from audio_app import AudioApps

from mlxcel.speech.speech_models import PiperTextToSpeech
from mlxcel_audio.piper import load_voice
from mlxcel_server.audio_speech import choose_speaker
from mlxcel_server.errors import ApiError

VOICE = Path(__file__).parents[1] / "audio" / "data" / "multi-speaker.onnx"


@pytest.fixture(scope="module")
def tts() -> PiperTextToSpeech:
    return PiperTextToSpeech("multi-speaker", load_voice(VOICE), ("wav", "pcm"))


@pytest.fixture(scope="module")
def client(tiny_loaded, tts):
    apps = AudioApps(tiny_loaded)
    client, _ = apps.make(tts=tts)
    yield client
    apps.close()


@pytest.mark.parametrize(
    ("voice", "speaker"),
    [(None, None), ("multi-speaker", None), ("bob", "bob"), ("1", "bob"), ("2", "cid")],
)
def test_voice_names_a_speaker_by_name_or_id(tts, voice, speaker):
    assert choose_speaker(tts, voice) == speaker


@pytest.mark.parametrize("voice", ["dan", "3", "alloy", "-1"])
def test_other_voices_are_refused(tts, voice):
    with pytest.raises(ApiError) as refusal:
        choose_speaker(tts, voice)
    assert "try ann, bob, cid or an id below 3" in str(refusal.value)


def test_the_endpoint_speaks_in_the_speaker_asked_for(client):
    def speak(voice: str):
        body = {"input": "Hi there.", "voice": voice, "response_format": "pcm"}
        return client.post("/v1/audio/speech", json=body)

    for voice in ("bob", "1", "multi-speaker"):
        reply = speak(voice)
        assert reply.status == 200 and len(reply.body) > 0, voice
    refused = speak("7")
    assert refused.status == 400
    assert refused.json()["error"]["param"] == "voice"
