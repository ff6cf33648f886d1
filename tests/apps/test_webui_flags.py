"""`mlxcel serve`'s web page flags: `--no-webui` and `--path`, with their environment
mirrors."""

import pytest

from mlxcel.cli import make_parser
from mlxcel.common.flags import UsageError, resolve_defaults
from mlxcel.serving.serve_command import FLAGS
from mlxcel.serving.server_flags import settings_from
from mlxcel_core.errors import InputError


def settings(argv, environ=None):
    args = make_parser("serve").parse_args(["serve", *argv])
    resolve_defaults(args, FLAGS, environ or {})
    return settings_from(args)


def test_the_page_is_served_by_default():
    result = settings([])
    assert result.webui and result.static_path is None


def test_no_webui_turns_it_off_from_the_command_line_or_the_environment():
    assert not settings(["--no-webui"]).webui
    assert not settings([], {"LLAMA_ARG_NO_WEBUI": "1"}).webui


def test_path_serves_a_folder(tmp_path):
    assert settings(["--path", str(tmp_path)]).static_path == tmp_path
    assert settings([], {"LLAMA_ARG_STATIC_PATH": str(tmp_path)}).static_path == tmp_path


def test_a_missing_folder_or_a_folder_without_the_page_is_refused(tmp_path):
    with pytest.raises(InputError, match="--path: no such folder"):
        settings(["--path", str(tmp_path / "missing")])
    page = tmp_path / "index.html"
    page.write_text("<html></html>")
    with pytest.raises(InputError, match=f"--path: {page} is not a folder"):
        settings(["--path", str(page)])
    with pytest.raises(UsageError, match="--no-webui serves no page"):
        settings(["--no-webui", "--path", str(tmp_path)])
