"""transcribe on the real Whisper tiny.en: every container gives the same text, long audio
runs in windows with increasing timestamps, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from speech_clips import HELLO, LONG_TEXTS, long_speech
from test_decoding import encoded

from mlxcel_audio.decoding import decode_audio
from mlxcel_audio.errors import AudioInputError
from mlxcel_audio.whisper import TranscribeOptions, UnsupportedTaskError, transcribe

from word_errors import word_error_rate


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("name", ["mp3", "flac", "ogg", "m4a", "webm"])
def test_every_container_transcribes_to_the_same_text(tiny_en, name):
    # wav is the clip itself (test_whisper_parity.py); mp4 holds the same AAC as m4a.
    assert transcribe(tiny_en, decode_audio(encoded(name))).text == HELLO


@pytest.mark.slow
@pytest.mark.long
def test_long_audio_is_transcribed_in_windows_with_increasing_timestamps(tiny_en):
    audio = long_speech()
    assert len(audio) > 30 * 16_000
    transcription = transcribe(tiny_en, audio)
    assert word_error_rate(" ".join(LONG_TEXTS), transcription.text) <= 0.1
    starts = [segment.start for segment in transcription.segments]
    ends = [segment.end for segment in transcription.segments]
    assert starts == sorted(starts) and all(s < e for s, e in zip(starts, ends, strict=True))
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))
    assert ends[-1] > 30.0  # the second window's timestamps count from its own start
    assert ends[-1] <= transcription.duration


def test_digital_silence_is_skipped_not_transcribed(tiny_en):
    # Without the skip tiny.en hears "you" in every window of zeros.
    transcription = transcribe(tiny_en, np.zeros(45 * 16_000, dtype=np.float32))
    assert transcription.text == "" and transcription.segments == ()
    assert transcription.duration == 45.0


def test_an_english_only_model_refuses_to_translate(tiny_en):
    audio = np.zeros(16_000, dtype=np.float32)
    with pytest.raises(UnsupportedTaskError, match="English-only: it cannot translate"):
        transcribe(tiny_en, audio, TranscribeOptions(task="translate"))
    with pytest.raises(UnsupportedTaskError, match="cannot transcribe 'fr'"):
        transcribe(tiny_en, audio, TranscribeOptions(language="French"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "summarize"}, "task must be"),
        ({"language": "klingon"}, "unknown language"),
        ({"temperature": 1.5}, "temperature must be between 0 and 1"),
        ({"temperature": (0.0, -0.2)}, "temperature must be between 0 and 1"),
        ({"temperature": "hot"}, "temperature must be a number"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(AudioInputError, match=message):
        TranscribeOptions(**options)


def test_language_names_become_codes():
    assert TranscribeOptions(language="English").language == "en"
    assert TranscribeOptions(temperature=0.3).temperatures == (0.3,)
    assert TranscribeOptions(temperature=[0.0, 0.5]).temperatures == (0.0, 0.5)


@pytest.mark.slow
@pytest.mark.long
def test_a_prompt_sets_the_style(tiny_en):
    audio = decode_audio(encoded("flac"))  # unprompted: HELLO as written
    shouted = transcribe(tiny_en, audio, TranscribeOptions(prompt=HELLO.upper()))
    assert shouted.text == HELLO.upper()
    assert len(shouted.segments) == 1
