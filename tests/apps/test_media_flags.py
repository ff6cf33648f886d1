"""Image flags: `serve`'s media policy (`--allowed-local-media-path`, `--media-fetch`, ...)
and `generate --image`, through the parser and `main(argv)` on the tiny text model."""

from __future__ import annotations

import io

import pytest

from mlxcel.cli import main, make_parser
from mlxcel.common.flags import UsageError, resolve_defaults
from mlxcel.common.media_flags import MAX_BYTES_FLAG, MEDIA_FLAGS
from mlxcel.serving.serve_command import FLAGS, settings_from
from mlxcel_core.errors import InputError
from mlxcel_vision.inputs.policy import DEFAULT_FETCH_TIMEOUT_SECONDS, DEFAULT_MAX_BYTES

from red_images import encode, red_data_url, red_image

CLOSED_PORT_URL = "http://127.0.0.1:9/red.png"


def decoder(argv, environ=None):
    args = make_parser("serve").parse_args(["serve", *argv])
    resolve_defaults(args, FLAGS, environ or {})
    return settings_from(args).image_decoder


def reason(decode, reference: str) -> str:
    with pytest.raises(ValueError) as caught:
        decode(reference, number=1)
    return str(caught.value)


def test_by_default_data_urls_are_read_and_paths_and_urls_refused(tmp_path):
    decode = decoder([])
    assert decode(red_data_url("PNG"), number=1).size == (64, 64)
    assert "local paths are not allowed" in reason(decode, str(tmp_path / "red.png"))
    assert "fetching http(s) URLs is disabled" in reason(decode, CLOSED_PORT_URL)


def test_the_allowed_directory_and_its_environment_mirror(tmp_path):
    (tmp_path / "red.png").write_bytes(encode(red_image(), "PNG"))
    for argv, environ in (
        (["--allowed-local-media-path", str(tmp_path)], {}),
        ([], {"MLXCEL_ALLOWED_LOCAL_MEDIA_PATH": str(tmp_path)}),
    ):
        assert decoder(argv, environ)("red.png", number=1).size == (64, 64)


def test_fetching_is_enabled_by_the_switch_or_its_mirror():
    for argv, environ in ((["--media-fetch"], {}), ([], {"MLXCEL_MEDIA_FETCH": "1"})):
        message = reason(decoder(argv, environ), CLOSED_PORT_URL)
        assert "disabled" not in message
        assert message.startswith(f"image 1: fetching {CLOSED_PORT_URL} failed")


def test_the_byte_limit_flag_applies_to_data_urls():
    decode = decoder(["--media-max-bytes", "50"])
    assert "too large" in reason(decode, red_data_url("PNG"))
    decode = decoder([], {"MLXCEL_MEDIA_MAX_BYTES": "50"})
    assert "too large" in reason(decode, red_data_url("PNG"))


def test_bad_media_flags_are_refused(tmp_path):
    with pytest.raises(InputError, match="--allowed-local-media-path: not a directory"):
        decoder(["--allowed-local-media-path", str(tmp_path / "absent")])
    with pytest.raises(UsageError, match="--media-fetch-timeout must be > 0"):
        decoder(["--media-fetch-timeout", "0"])
    with pytest.raises(UsageError, match="--media-max-bytes must be >= 1"):
        decoder(["--media-max-bytes", "0"])


def run_cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    code = main(list(argv), environ={}, out=io.StringIO(), err=err)
    return code, err.getvalue()


def assert_one_line_error(code: int, err: str, expected_code: int, message: str) -> None:
    assert code == expected_code
    assert err.startswith("mlxcel: error: ")
    assert err.count("\n") == 1, err
    assert message in err


@pytest.fixture
def red_png(tmp_path):
    path = tmp_path / "red.png"
    path.write_bytes(encode(red_image(), "PNG"))
    return path


def test_generate_with_an_image_on_a_text_only_model_is_one_line(tiny_gguf, red_png):
    code, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "Colour?", "--image", str(red_png))
    assert_one_line_error(code, err, 1, "has no vision support; --image needs a vision-language")


def test_generate_names_an_unusable_image_file(tiny_gguf, tmp_path, red_png):
    text = tmp_path / "notes.png"
    text.write_text("no picture here")
    for path, message in ((tmp_path / "absent.png", "no such file"), (text, "not an image")):
        argv = ["--image", str(red_png), "--image", str(path)]
        code, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "x", *argv)
        assert_one_line_error(code, err, 1, f"--image {path}: {message}")


def test_generate_checks_the_byte_limit_without_an_image(tiny_gguf):
    code, err = run_cli("generate", "-m", str(tiny_gguf), "-p", "x", "--media-max-bytes", "0")
    assert_one_line_error(code, err, 2, "--media-max-bytes must be >= 1, got 0")


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["-no-cnv"], "drop -no-cnv"), (["--prompts-file", "PROMPTS"], "not --prompts-file")],
)
def test_generate_refuses_images_where_no_chat_message_holds_them(
    tiny_gguf, tmp_path, red_png, extra, message
):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\n")
    extra = [str(prompts) if item == "PROMPTS" else item for item in extra]
    prompt = [] if "--prompts-file" in extra else ["-p", "x"]
    code, err = run_cli("generate", "-m", str(tiny_gguf), *prompt, *extra, "--image", str(red_png))
    assert_one_line_error(code, err, 2, message)


def test_the_help_states_the_limits_mlxcel_vision_applies_by_default():
    (timeout_flag,) = [flag for flag in MEDIA_FLAGS if flag.dest == "media_fetch_timeout"]
    assert f"(default: {DEFAULT_MAX_BYTES / 2**20:g} MiB)" in MAX_BYTES_FLAG.help
    assert f"(default: {DEFAULT_FETCH_TIMEOUT_SECONDS:g})" in timeout_flag.help
