"""Word timestamps on the real Whisper tiny.en (speech made by the Piper voice): the words are
the transcript's, in order, inside their segments, after a pause where the speech resumes,
and where CTranslate2's alignment puts them; and the pieces of the alignment on small inputs."""

from __future__ import annotations

import io
import itertools
import json

import mlx.core as mx
import numpy as np
import pytest
import soundfile
from ctranslate2_runs import ctranslate2_align
from speech_clips import HELLO, SAMPLE_RATE, SENTENCES, speech
from test_whisper_loading import random_weights, write_hugging_face, write_mlx_whisper

from mlxcel.cli import main
from mlxcel.speech.speech_models import WhisperSpeechToText
from mlxcel_audio.features import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from mlxcel_audio.whisper import TranscribeOptions, load_whisper, transcribe
from mlxcel_audio.whisper.decoding import encode_window
from mlxcel_audio.whisper.timing import (
    WordTiming,
    dtw,
    find_alignment,
    median_filter,
    merge_punctuations,
    split_to_word_tokens,
)
from mlxcel_models.errors import ModelLoadError
from mlxcel_server.audio_models import TranscriptionRequest

from word_errors import words

PAUSE_SECONDS = 2.0
SECOND = SENTENCES[2]


@pytest.fixture(scope="module")
def two_sentences() -> tuple[np.ndarray, float]:
    """HELLO, 2 s of silence, then the second sentence; and when the second one starts (s)."""
    first = speech(HELLO)
    silence = np.zeros(int(PAUSE_SECONDS * SAMPLE_RATE), dtype=np.float32)
    return np.concatenate([first, silence, speech(SECOND)]), len(first) / SAMPLE_RATE + 2.0


@pytest.fixture(scope="module")
def timed(tiny_en, two_sentences):
    return transcribe(tiny_en, two_sentences[0], TranscribeOptions(word_timestamps=True))


def test_dtw_follows_the_cheapest_monotonic_path():
    cost = np.array([[0.0, 0.0, 9.0, 9.0], [9.0, 9.0, 0.0, 9.0], [9.0, 9.0, 9.0, 0.0]])
    rows, columns = dtw(cost)
    assert rows.tolist() == [0, 0, 1, 2]
    assert columns.tolist() == [0, 1, 2, 3]


def test_median_filter_takes_the_running_median_with_reflected_edges():
    x = np.array([[5.0, 1.0, 9.0, 2.0, 7.0]])
    # padded by reflection: 9 1 | 5 1 9 2 7 | 2 9
    assert median_filter(x, 3).tolist() == [[1.0, 5.0, 2.0, 7.0, 2.0]]
    assert median_filter(x[:, :1], 7).tolist() == [[5.0]]


def test_punctuation_joins_its_neighbouring_words():
    timings = [
        WordTiming(w, [i], float(i), float(i + 1), 1.0)
        for i, w in enumerate([" (", "Hello", ",", " world", ")", "."])
    ]
    assert [t.word for t in merge_punctuations(timings)] == [" (Hello,", " world)."]


def test_tokens_split_into_words_at_spaces_and_punctuation(tiny_en):
    tokens = tiny_en.tokenizer.encode(" Hello world, it's unbelievable.")
    split = split_to_word_tokens(tiny_en, tokens, "en")
    assert [text for text, _ in split] == [" Hello", " world", ",", " it's", " unbelievable", "."]
    assert [t for _, word_tokens in split for t in word_tokens] == tokens


def test_alignment_heads_come_from_the_ctranslate2_config(tiny_en, tiny_en_path):
    config = json.loads((tiny_en_path / "config.json").read_text())
    assert tiny_en.alignment_heads == tuple(tuple(pair) for pair in config["alignment_heads"])


def test_alignment_heads_come_from_each_layout_or_the_second_half(tmp_path, tiny_en_path):
    weights, tokenizer = random_weights(), tiny_en_path / "tokenizer.json"
    hugging_face = write_hugging_face(tmp_path / "hf", weights, tokenizer)
    (hugging_face / "generation_config.json").write_text('{"alignment_heads": [[1, 2], [0, 3]]}')
    assert load_whisper(hugging_face).alignment_heads == ((1, 2), (0, 3))
    mlx_whisper = write_mlx_whisper(tmp_path / "mlx", weights, tokenizer)
    # two decoder layers of four heads: every head of the second layer
    assert load_whisper(mlx_whisper).alignment_heads == ((1, 0), (1, 1), (1, 2), (1, 3))
    config = json.loads((mlx_whisper / "config.json").read_text())
    (mlx_whisper / "config.json").write_text(json.dumps({**config, "alignment_heads": [[2, 0]]}))
    with pytest.raises(ModelLoadError, match=r"alignment head \(2, 0\).*outside"):
        load_whisper(mlx_whisper)


def test_the_alignment_pass_gives_the_decoders_logits_and_attention(tmp_path, tiny_en_path):
    folder = write_mlx_whisper(tmp_path / "mlx", random_weights(), tiny_en_path / "tokenizer.json")
    whisper = load_whisper(folder)
    features = mx.array(np.random.default_rng(0).standard_normal((3000, 80)), mx.float32)
    cross_kv = encode_window(whisper, features)
    tokens = mx.array([[whisper.tokenizer.sot, *whisper.tokenizer.encode(" Hello world")]])
    logits, scores = whisper.model.decoder.cross_attention_scores(tokens, cross_kv)
    expected, _ = whisper.model.decoder(tokens, cross_kv)
    np.testing.assert_allclose(np.array(logits), np.array(expected), atol=1e-4)
    assert len(scores) == whisper.dims.n_text_layer
    assert scores[0].shape == (1, whisper.dims.n_text_head, tokens.shape[1], 1500)
    # The scores' softmax is the attention: its rows sum to one and differ between tokens.
    attention = np.array(mx.softmax(scores[-1], axis=-1))
    np.testing.assert_allclose(attention.sum(axis=-1), 1.0, atol=1e-5)
    assert not np.allclose(attention[0, 0, 0], attention[0, 0, 1])


@pytest.mark.slow
@pytest.mark.long
def test_words_are_the_transcript_in_order_inside_their_segments(timed):
    all_words = [word for segment in timed.segments for word in segment.words]
    assert words("".join(word.word for word in all_words)) == words(timed.text)
    assert "".join(word.word for word in all_words).strip() == timed.text
    assert all(word.start < word.end for word in all_words)
    assert all(a.end <= b.start for a, b in itertools.pairwise(all_words))
    for segment in timed.segments:
        assert segment.words
        assert segment.start <= segment.words[0].start and segment.words[-1].end <= segment.end
        assert 0.0 < min(word.probability for word in segment.words) <= 1.0


@pytest.mark.slow
@pytest.mark.long
def test_the_second_sentence_starts_after_the_pause(timed, two_sentences):
    _, resumes = two_sentences
    all_words = [word for segment in timed.segments for word in segment.words]
    first_of_second = next(w for w in all_words if w.word.strip() == SECOND.split()[0])
    assert resumes - 0.1 <= first_of_second.start <= resumes + 0.3
    last_of_first = all_words[all_words.index(first_of_second) - 1]
    assert last_of_first.end <= resumes - PAUSE_SECONDS + 0.3


@pytest.mark.slow
@pytest.mark.long
def test_word_starts_match_ctranslate2s_alignment(tiny_en, tiny_en_path, two_sentences):
    audio, _ = two_sentences
    features = log_mel_spectrogram(audio, padding=N_SAMPLES)
    num_frames = features.shape[0] - N_FRAMES
    window = pad_or_trim(features[:N_FRAMES])
    text_tokens = tiny_en.tokenizer.encode(" " + HELLO + " " + SECOND)
    sot = [tiny_en.tokenizer.sot]
    cross_kv = encode_window(tiny_en, window)
    mine = find_alignment(tiny_en, cross_kv, sot_sequence=sot, text_tokens=text_tokens,
                          num_frames=num_frames, language="en")  # fmt: skip

    aligned = ctranslate2_align(tiny_en_path, np.array(window), sot, text_tokens, num_frames)
    rows, frames = aligned.T
    token_starts = frames[np.diff(rows, prepend=-1).astype(bool)] / 50
    word_firsts = np.cumsum([0] + [len(t.tokens) for t in mine])[:-1]
    assert [t.start for t in mine] == pytest.approx(token_starts[word_firsts], abs=0.1)


@pytest.mark.slow
@pytest.mark.long
def test_the_server_adapter_times_words_when_asked(tiny_en):
    data = io.BytesIO()
    soundfile.write(data, speech(HELLO), SAMPLE_RATE, format="WAV")
    stt = WhisperSpeechToText("whisper-tiny.en", tiny_en)
    transcript = stt.transcribe(data.getvalue(), TranscriptionRequest(word_timestamps=True))
    timed_words = [w.word.strip() for s in transcript.segments for w in s.words]
    assert timed_words == HELLO.split()


@pytest.mark.slow
@pytest.mark.long
def test_transcribe_command_lists_words_in_verbose_json(tmp_path, tiny_en_path):
    path = tmp_path / "hello.wav"
    soundfile.write(path, speech(HELLO), SAMPLE_RATE)
    out, err = io.StringIO(), io.StringIO()
    argv = ["transcribe", str(path), "-m", str(tiny_en_path), "--response-format",
            "verbose_json", "--word-timestamps"]  # fmt: skip
    assert main(argv, environ={}, out=out, err=err) == 0
    body = json.loads(out.getvalue())
    assert [w["word"] for w in body["words"]] == HELLO.split()
    assert set(body["words"][0]) == {"word", "start", "end"}
    assert body["segments"][0]["text"].strip() == HELLO


def test_transcribe_command_refuses_word_timestamps_without_verbose_json(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    argv = ["transcribe", str(tmp_path / "absent.wav"), "--word-timestamps"]
    environ = {"MLXCEL_STT_RESPONSE_FORMAT": "srt"}
    assert main(argv, environ=environ, out=out, err=err) != 0
    # The format came from the environment, so the refusal names its variable.
    assert "--word-timestamps needs MLXCEL_STT_RESPONSE_FORMAT verbose_json" in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1
