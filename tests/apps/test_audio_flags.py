"""`mlxcel serve`'s speech flags: defaults from the audio extra, `none`, `--no-audio`, bad paths."""

import io

import pytest

from mlxcel.cli import main, make_parser
from mlxcel.common.flags import UsageError, resolve_defaults
from mlxcel.serving.serve_command import FLAGS, settings_from
from mlxcel.speech.audio_flags import AUDIO_FLAGS, SpeechModelPaths, speech_model_paths
from mlxcel_audio.default_models import default_stt_model, default_tts_voice
from mlxcel_core.errors import InputError


def parsed(argv, environ=None):
    args = make_parser("serve").parse_args(["serve", *argv])
    resolve_defaults(args, FLAGS, environ or {})
    return args


def test_the_audio_extras_models_are_the_defaults():
    stt, tts = default_stt_model(), default_tts_voice()
    assert (stt / "model.bin").is_file()
    assert tts.name == "en_US-joe-medium.onnx" and tts.with_name(tts.name + ".json").is_file()
    assert speech_model_paths(parsed([])) == SpeechModelPaths(stt, tts)


def test_none_leaves_one_model_out_and_no_audio_both():
    assert speech_model_paths(parsed(["--stt-model", "none"])).stt is None
    assert speech_model_paths(parsed([], {"MLXCEL_TTS_MODEL": "None"})).tts is None
    assert speech_model_paths(parsed(["--no-audio"])) == SpeechModelPaths(None, None)
    assert speech_model_paths(parsed([], {"MLXCEL_NO_AUDIO": "1"})) == SpeechModelPaths(None, None)


def test_a_given_path_replaces_the_default(tmp_path):
    paths = speech_model_paths(parsed(["--stt-model", str(tmp_path)]))
    assert paths.stt == tmp_path and paths.tts == default_tts_voice()


def test_no_audio_with_a_model_path_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="--no-audio"):
        speech_model_paths(parsed(["--no-audio", "--tts-model", str(tmp_path)]))


def test_the_upload_limit_reaches_the_settings():
    assert settings_from(parsed([])).audio_max_bytes == 25 * 2**20
    assert settings_from(parsed(["--audio-max-bytes", "1000"])).audio_max_bytes == 1000
    with pytest.raises(UsageError, match="--audio-max-bytes must be >= 1"):
        settings_from(parsed(["--audio-max-bytes", "0"]))


def test_every_speech_flag_has_an_mlxcel_environment_mirror():
    assert all(flag.env_name.startswith("MLXCEL_") for flag in AUDIO_FLAGS)


@pytest.mark.parametrize("flag", ["--stt-model", "--tts-model"])
def test_a_missing_path_is_a_one_line_error_before_listening(tiny_gguf, tmp_path, flag):
    err = io.StringIO()
    missing = str(tmp_path / "nothing-here")
    code = main(["serve", "-m", str(tiny_gguf), flag, missing], environ={}, out=io.StringIO(),
                err=err)  # fmt: skip
    assert code == 1
    assert err.getvalue() == f"mlxcel: error: {flag}: no such file or folder: {missing}\n"
    with pytest.raises(InputError):
        speech_model_paths(parsed([flag, missing]))
