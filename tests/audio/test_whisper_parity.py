"""Parity with CTranslate2 on the real Whisper tiny.en: the same greedy tokens on the same
features, and transcripts with the words spoken (speech made by the Piper voice)."""

from __future__ import annotations

import numpy as np
import pytest
from ctranslate2_runs import ctranslate2_generate
from speech_clips import HELLO, SENTENCES, speech

from mlxcel_audio.features import N_SAMPLES, log_mel_spectrogram, pad_or_trim
from mlxcel_audio.whisper import transcribe
from mlxcel_audio.whisper.decoding import decode_window, encode_window

from word_errors import word_error_rate

pytestmark = [pytest.mark.slow, pytest.mark.long]
CLIPS = {"hello": (HELLO,), "sentences": SENTENCES}


def clip(name: str) -> tuple[str, np.ndarray]:
    """The clip's text and its speech, sentence after sentence."""
    texts = CLIPS[name]
    return " ".join(texts), np.concatenate([speech(text) for text in texts])


@pytest.mark.parametrize("name", CLIPS)
def test_greedy_tokens_equal_ctranslate2s_with_timestamps(tiny_en, tiny_en_path, name):
    text, audio = clip(name)
    features = pad_or_trim(log_mel_spectrogram(audio, padding=N_SAMPLES))
    sot = [tiny_en.tokenizer.sot]
    expected, expected_no_speech = ctranslate2_generate(tiny_en_path, np.array(features), sot)
    mine = decode_window(tiny_en, encode_window(tiny_en, features), sot_sequence=sot, prompt=[],
                         temperature=0.0)  # fmt: skip
    assert list(mine.tokens) == expected
    assert mine.tokens[0] >= tiny_en.tokenizer.timestamp_begin
    assert mine.no_speech_prob == pytest.approx(expected_no_speech, abs=1e-5)
    assert word_error_rate(text, tiny_en.tokenizer.decode(mine.tokens)) <= 0.1


def test_greedy_tokens_equal_ctranslate2s_without_timestamps(tiny_en, tiny_en_path):
    features = pad_or_trim(log_mel_spectrogram(clip("hello")[1], padding=N_SAMPLES))
    sot = [tiny_en.tokenizer.sot, tiny_en.tokenizer.no_timestamps]
    expected, _ = ctranslate2_generate(tiny_en_path, np.array(features), sot)
    mine = decode_window(tiny_en, encode_window(tiny_en, features), sot_sequence=sot, prompt=[],
                         temperature=0.0)  # fmt: skip
    assert list(mine.tokens) == expected


def test_transcription_has_the_spoken_words(tiny_en):
    text, audio = clip("sentences")
    transcription = transcribe(tiny_en, audio)
    assert word_error_rate(text, transcription.text) <= 0.1
    assert transcription.language == "en"
    assert transcription.duration == pytest.approx(len(audio) / 16_000)
    assert [segment.id for segment in transcription.segments] == [0, 1, 2][
        : len(transcription.segments)
    ]
