"""`mlxcel serve`'s flags: monitoring switches, API keys, the listening address."""

import io
import socket

import pytest

from mlxcel.cli import main, make_parser
from mlxcel.flags import UsageError, resolve_defaults
from mlxcel.serve_command import FLAGS, settings_from


def settings(argv, environ):
    args = make_parser("serve").parse_args(["serve", *argv])
    resolve_defaults(args, FLAGS, environ)
    return settings_from(args)


def test_monitoring_endpoints_are_off_by_default():
    result = settings([], {})
    assert not (result.endpoint_metrics or result.endpoint_slots or result.endpoint_props)


def test_switches_and_environment_mirrors_enable_them():
    assert settings(["--metrics", "--slots", "--props"], {}).endpoint_slots
    result = settings([], {"LLAMA_ARG_ENDPOINT_METRICS": "1", "LLAMA_ARG_ENDPOINT_PROPS": "true"})
    assert result.endpoint_metrics and result.endpoint_props and not result.endpoint_slots


@pytest.mark.parametrize("argv", [["--api-key", ","], ["--api-key-file", "EMPTY"]])
def test_key_options_that_give_no_key_are_refused(tmp_path, argv):
    empty = tmp_path / "keys.txt"
    empty.write_text("\n  \n")
    with pytest.raises(UsageError, match="gave no keys"):
        settings([str(empty) if a == "EMPTY" else a for a in argv], {})


def test_a_port_in_use_is_reported_before_serving(tiny_gguf):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = io.StringIO()
        argv = ["serve", "-m", str(tiny_gguf), "--port", str(port)]
        code = main(argv, environ={}, out=io.StringIO(), err=err)
    assert code == 1
    assert err.getvalue().startswith(f"mlxcel: error: cannot listen on 127.0.0.1:{port}")
    assert "listening" not in err.getvalue()
