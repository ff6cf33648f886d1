"""Piper's other voice parts against onnxruntime: several speakers, HiFi-GAN's ResBlock1 and
the deterministic duration predictor, on the small random-weight voices in tests/audio/data/
(built by make_piper_test_voices.py in Piper's own architecture and exporter)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from piper.config import SynthesisConfig
from piper.voice import PiperVoice as OnnxPiperVoice

from mlxcel_audio.errors import AudioInputError
from mlxcel_audio.piper import PiperVoice, VoiceLoadError, load_voice

DATA = Path(__file__).parent / "data"
HOP_LENGTH = 256
SENTENCE = "The quick brown fox jumps over the lazy dog."
SPEAKERS = {"ann": 0, "bob": 1, "cid": 2}
# The random-weight voices peak near 0.03-0.08; the waveforms agree to about 1e-6 of that.
RELATIVE_TOLERANCE = 1e-5


def _voices(name: str) -> tuple[PiperVoice, OnnxPiperVoice]:
    path = DATA / f"{name}.onnx"
    return load_voice(path), OnnxPiperVoice.load(path, include_alignments=True)


@pytest.fixture(scope="module")
def multi_speaker() -> tuple[PiperVoice, OnnxPiperVoice]:
    return _voices("multi-speaker")


@pytest.fixture(scope="module")
def resblock1() -> tuple[PiperVoice, OnnxPiperVoice]:
    return _voices("resblock1")


@pytest.fixture(scope="module")
def deterministic_durations() -> tuple[PiperVoice, OnnxPiperVoice]:
    return _voices("deterministic-durations")


def _assert_matches_onnxruntime(
    voice: PiperVoice, onnx_voice: OnnxPiperVoice, speaker: str | None
) -> None:
    [ids] = voice.phoneme_ids(SENTENCE)
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, speaker_id=SPEAKERS.get(speaker))
    expected_audio, expected_samples = onnx_voice.phoneme_ids_to_audio(
        ids, config, include_alignments=True
    )
    ours = voice.synthesize_ids(ids, speaker=speaker, noise_scale=0.0, noise_w=0.0)

    np.testing.assert_array_equal(ours.durations * HOP_LENGTH, expected_samples)
    assert ours.audio.shape == expected_audio.shape
    peak = float(np.max(np.abs(expected_audio)))
    assert peak > 1e-3
    np.testing.assert_allclose(ours.audio, expected_audio, atol=RELATIVE_TOLERANCE * peak)


@pytest.mark.parametrize("speaker", list(SPEAKERS))
def test_each_speaker_matches_onnxruntime(multi_speaker, speaker):
    _assert_matches_onnxruntime(*multi_speaker, speaker)


def test_resblock1_matches_onnxruntime(resblock1):
    _assert_matches_onnxruntime(*resblock1, None)


def test_deterministic_durations_match_onnxruntime(deterministic_durations):
    _assert_matches_onnxruntime(*deterministic_durations, None)


def test_speakers_speak_differently(multi_speaker):
    voice, _ = multi_speaker
    [ids] = voice.phoneme_ids(SENTENCE)
    ann, bob = (
        voice.synthesize_ids(ids, speaker=name, noise_scale=0.0, noise_w=0.0)
        for name in ["ann", "bob"]
    )

    assert not np.array_equal(ann.durations, bob.durations)
    n = min(ann.audio.size, bob.audio.size)
    assert np.max(np.abs(ann.audio[:n] - bob.audio[:n])) > 0.1 * np.max(np.abs(ann.audio))


def test_a_speaker_is_named_or_numbered(multi_speaker):
    voice, _ = multi_speaker

    assert voice.speakers == ("ann", "bob", "cid")
    assert [voice.speaker_id(s) for s in ("bob", 1, "1", "cid", 2)] == [1, 1, 1, 2, 2]
    # Piper's default: the config's default_speaker_id, here absent, so 0.
    assert voice.speaker_id(None) == 0


@pytest.mark.parametrize(
    ("speaker", "message"),
    [
        ("dan", "unknown speaker 'dan'; this voice's speakers: ann, bob, cid or an id below 3"),
        ("3", "unknown speaker '3'"),
        (-1, "unknown speaker -1"),
        ("Ann", "unknown speaker 'Ann'"),
        ("1.5", "unknown speaker '1.5'"),
        # Digits of other scripts, which int() reads as 1 and 2.
        ("\u0661", "unknown speaker '\u0661'"),
        ("\uff12", "unknown speaker '\uff12'"),
    ],
)
def test_unknown_speakers_raise_audio_input_error(multi_speaker, speaker, message):
    voice, _ = multi_speaker

    with pytest.raises(AudioInputError, match=message):
        voice.synthesize("Hi.", speaker=speaker)


def test_a_single_speaker_voice_takes_no_speaker(resblock1):
    voice, _ = resblock1

    assert voice.speakers == ()
    with pytest.raises(AudioInputError, match="none: it has one speaker"):
        voice.synthesize("Hi.", speaker="0")


def test_text_is_spoken_per_speaker_and_normalized(multi_speaker):
    voice, _ = multi_speaker

    for speaker in ("ann", "2"):
        chunks = list(voice.synthesize("Yes. No.", speaker=speaker, seed=1))
        assert len(chunks) == 2
        for chunk in chunks:
            assert chunk.dtype == np.float32 and chunk.size > HOP_LENGTH
            assert math.isclose(float(np.max(np.abs(chunk))), 1.0, rel_tol=1e-6)


def test_deterministic_durations_take_no_noise(deterministic_durations):
    voice, _ = deterministic_durations
    [ids] = voice.phoneme_ids(SENTENCE)

    quiet = voice.synthesize_ids(ids, noise_scale=0.0, noise_w=0.0)
    noisy = voice.synthesize_ids(ids, noise_scale=0.0, noise_w=1.0)

    np.testing.assert_array_equal(quiet.durations, noisy.durations)


def _write_config(tmp_path: Path, edit) -> Path:
    config = json.loads((DATA / "multi-speaker.onnx.json").read_text(encoding="utf-8"))
    edit(config)
    path = tmp_path / "voice.onnx.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda config: config.update(num_speakers=1, speaker_id_map={}),
            "says num_speakers 1, but .*multi-speaker.onnx holds 3",
        ),
        (
            lambda config: config["speaker_id_map"].update(dan=3),
            r"has speaker id 3, outside \[0, 3\) \(num_speakers\)",
        ),
        (
            lambda config: config.update(default_speaker_id=5),
            "has speaker id 5",
        ),
    ],
)
def test_configs_that_disagree_on_speakers_are_refused(tmp_path, edit, message):
    config_path = _write_config(tmp_path, edit)

    with pytest.raises(VoiceLoadError, match=message):
        load_voice(DATA / "multi-speaker.onnx", config_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda config: config["audio"].update(sample_rate=0), "audio.sample_rate 0"),
        (lambda config: config["inference"].update(length_scale=0), "length_scale 0.0"),
        (lambda config: config["inference"].update(length_scale=float("nan")), "length_scale"),
        (lambda config: config["inference"].update(noise_w=float("inf")), "noise_w inf"),
        (lambda config: config["espeak"].update(voice="xx-nope"), "no voice 'xx-nope'"),
    ],
)
def test_configs_that_cannot_be_spoken_are_refused_when_loading(tmp_path, edit, message):
    # Each of these loaded before; then every request failed with a traceback (in the
    # phonemizer, the model or the encoder) or, at length_scale 0, spoke nothing.
    config_path = _write_config(tmp_path, edit)

    with pytest.raises(VoiceLoadError, match=message):
        load_voice(DATA / "multi-speaker.onnx", config_path)


def test_speakers_without_names_are_their_ids(tmp_path):
    config_path = _write_config(tmp_path, lambda config: config.update(speaker_id_map={}))
    voice = load_voice(DATA / "multi-speaker.onnx", config_path)

    assert voice.speakers == ("0", "1", "2")
    assert voice.speaker_id("2") == 2


def test_the_default_speaker_is_the_configs(tmp_path):
    config_path = _write_config(tmp_path, lambda config: config.update(default_speaker_id=2))
    voice = load_voice(DATA / "multi-speaker.onnx", config_path)
    [ids] = voice.phoneme_ids("Hi.")

    default = voice.synthesize_ids(ids, noise_scale=0.0, noise_w=0.0)
    cid = voice.synthesize_ids(ids, speaker="cid", noise_scale=0.0, noise_w=0.0)

    np.testing.assert_array_equal(default.audio, cid.audio)
