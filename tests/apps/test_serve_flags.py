"""`mlxcel serve`'s flags: monitoring switches, API keys, the listening address."""

import io
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mlxcel.cli import main, make_parser
from mlxcel.common.flags import UsageError, resolve_defaults
from mlxcel.models.store_flags import resolve_store_flags
from mlxcel.serving import serve_command
from mlxcel.serving.serve_command import FLAGS, settings_from
from mlxcel_core.engine.config import default_residual_window

from live_server import LiveServer, free_port


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


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["-c", "-5"], {}, "-c/--ctx-size must be >= 0, got -5"),
        ([], {"LLAMA_ARG_CTX_SIZE": "-5"}, "LLAMA_ARG_CTX_SIZE must be >= 0, got -5"),
        (["-n", "-5"], {}, "-n/--n-predict must be -1 or >= 0, got -5"),
        ([], {"LLAMA_ARG_N_PREDICT": "-5"}, "LLAMA_ARG_N_PREDICT must be -1 or >= 0, got -5"),
    ],
)  # fmt: skip
def test_a_context_size_or_token_limit_out_of_range_names_its_flag_or_variable(
    tiny_gguf, argv, environ, message
):
    err = io.StringIO()
    code = main(["serve", "-m", str(tiny_gguf), *argv], environ=environ, out=io.StringIO(), err=err)
    assert code == 2
    assert err.getvalue() == f"mlxcel: error: {message}\n"


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


def test_chat_template_flags_replace_the_models_template_for_every_request(tiny_gguf, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    args = make_parser("serve").parse_args(
        ["serve", "-m", str(tiny_gguf), "--chat-template-file", str(template)]
    )
    resolve_defaults(args, FLAGS, {})
    resolve_store_flags(args, {})
    load = serve_command._loader(args, settings_from(args), io.StringIO())
    # On a thread of its own, as the server loads: it sets up that thread's MLX stream.
    with ThreadPoolExecutor(1) as pool:
        loaded, _, _ = pool.submit(load).result()
    rendered = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "<<hi>>"


def test_an_unknown_chat_template_name_stops_the_server_before_loading(tiny_gguf):
    err = io.StringIO()
    argv = ["serve", "-m", str(tiny_gguf), "--chat-template", "no-such-template"]
    assert main(argv, environ={}, out=io.StringIO(), err=err) == 2
    assert err.getvalue().count("\n") == 1 and "chat_template must be a built-in name" in (
        err.getvalue()
    )


def test_an_unexpected_loading_error_stops_the_server_instead_of_leaving_it_loading(
    tiny_gguf, monkeypatch
):
    def broken_loader(*args, **kwargs):
        raise RuntimeError("a defect while loading")

    monkeypatch.setattr(serve_command, "load_target_model", broken_loader)
    argv = ["serve", "-m", str(tiny_gguf), "--port", str(free_port())]
    with pytest.raises(RuntimeError, match="a defect while loading"):
        main(argv, environ={}, out=io.StringIO(), err=io.StringIO())


def test_serve_logs_the_model_it_loaded_and_one_line_per_request(tiny_gguf):
    server = LiveServer("-m", str(tiny_gguf), "-c", "64", "-a", "tiny", "-ctk", "turbo4")
    try:
        with server.stderr_on_failure():
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            assert httpx.post(server.url + "/v1/chat/completions", json=body).status_code == 200
            assert httpx.get(server.url + "/nowhere").status_code == 404
    finally:
        server.stop()
    lines = server.stderr().splitlines()
    assert any(re.fullmatch(r"mlxcel: ready: tiny loaded in [\d.]+ s, .*", ln) for ln in lines)
    # How the weights are held, as `generate` says it.
    (weights,) = (ln for ln in lines if ln.startswith("mlxcel: weights: "))
    assert "Q8_0→" in weights and "matrix products on " in weights
    # The KV cache types and the residual window, whose default differs by device.
    window = default_residual_window("turbo4", "auto")
    assert f"mlxcel: KV cache: K turbo4, V auto, residual window {window}" in lines
    access = r"mlxcel: 127\.0\.0\.1 {} {} {} \d+\.\d{{3}} s"
    assert any(re.fullmatch(access.format("POST", "/v1/chat/completions", 200), ln) for ln in lines)
    assert any(re.fullmatch(access.format("GET", "/nowhere", 404), ln) for ln in lines)


def test_log_disable_leaves_only_errors(tiny_gguf):
    server = LiveServer("-m", str(tiny_gguf), "-c", "64", "--log-disable")
    try:
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.stop()
    lines = server.stderr().splitlines()
    assert not [ln for ln in lines if ln.startswith("mlxcel: ") or "[INFO]" in ln]
