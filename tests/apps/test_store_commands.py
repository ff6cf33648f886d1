"""Hugging Face ids as `-m`, and `mlxcel list`, `rm` and `arch`, against a local Hub."""

import io
import json
import os
import pty
import sys

import pytest

from mlxcel.cli import main

from hf_hub_server import HubServer, folder_files

REPO = "test-org/tiny"


def run_cli(*argv: str, environ: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str, expected_code: int, message: str) -> None:
    assert code == expected_code
    assert err.startswith("mlxcel: error: "), err
    assert err.count("\n") == 1, err
    assert message in err


@pytest.fixture
def hub(tiny_safetensors):
    with HubServer() as server:
        server.add_repo(REPO, folder_files(tiny_safetensors))
        yield server


@pytest.fixture
def environ(tmp_path, hub):
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "MLXCEL_CACHE_DIR": str(tmp_path / "mlxcel"),
    }


def generate(*flags: str, environ: dict[str, str]) -> tuple[int, str, str]:
    return run_cli("generate", *flags, "-p", "hello", "-n", "4", "-no-cnv", "--temp", "0",
                   environ=environ)  # fmt: skip


def test_generate_downloads_an_id_once_then_runs_from_the_store(tmp_path, hub, environ):
    code, out, err = generate("-m", REPO, environ=environ)
    assert code == 0, err
    assert "generated: 4 tokens" in err
    assert (tmp_path / "mlxcel" / "models" / REPO / "model.safetensors").is_file()
    hub.requests.clear()
    bare = {**environ, "MLXCEL_DEFAULT_ORG": "test-org"}
    assert generate("-m", "tiny", environ=bare)[1] == out
    assert hub.requests == []


def test_models_dir_flag_and_its_environment_mirror(tmp_path, environ):
    assert generate("-m", REPO, "--models-dir", str(tmp_path / "a"), environ=environ)[0] == 0
    mirrored = {**environ, "MLXCEL_MODELS_DIR": str(tmp_path / "b")}
    assert generate("-m", REPO, environ=mirrored)[0] == 0
    assert (tmp_path / "a" / REPO).is_dir() and (tmp_path / "b" / REPO).is_dir()
    assert not (tmp_path / "mlxcel").exists()


def test_revision_is_passed_through(hub, environ, tiny_safetensors):
    hub.repos[REPO].add_commit(folder_files(tiny_safetensors) | {"extra.json": b"{}"}, refs=("v1",))
    assert generate("-m", REPO, "--revision", "v1", environ=environ)[0] == 0
    assert any(r.path == f"/api/models/{REPO}/revision/v1" for r in hub.requests)
    assert generate("-m", REPO, environ={**environ, "MLXCEL_REVISION": "v1"})[0] == 0
    assert not any(r.path.endswith("/revision/main") for r in hub.requests)


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_revision_without_an_id_is_a_usage_error(tiny_gguf, environ, command):
    code, _, err = run_cli(command, "-m", str(tiny_gguf), "--revision", "v1", environ=environ)
    assert_one_line_error(code, err, 2, "--revision applies to a Hugging Face id")
    code, _, err = run_cli(command, "--revision", "v1", environ=environ)
    assert_one_line_error(code, err, 2, "not to the default model")


def test_offline_without_the_model_fails_naming_it(hub, environ):
    code, _, err = generate("-m", REPO, environ={**environ, "HF_HUB_OFFLINE": "1"})
    assert_one_line_error(code, err, 1, f"{REPO} is neither in the model store")
    assert hub.requests == []


def test_unknown_ids_and_unreachable_hubs_are_one_line_errors(environ):
    code, _, err = generate("-m", "test-org/absent", environ=environ)
    assert_one_line_error(code, err, 1, "no model test-org/absent on http://")
    with HubServer() as gone:
        endpoint = gone.url
    code, _, err = generate("-m", REPO, environ={**environ, "HF_ENDPOINT": endpoint})
    assert_one_line_error(code, err, 1, "cannot be reached")


def test_neither_a_path_nor_an_id_is_model_not_found(tmp_path, environ):
    code, _, err = generate("-m", "a/b/c", environ=environ)
    assert_one_line_error(code, err, 1, "model not found: a/b/c")


def test_a_draft_model_may_be_an_id(hub, environ):
    code, _, err = generate(
        "-m", REPO, "-md", REPO, "--draft-max", "2", "--draft-p-min", "0", environ=environ
    )
    assert code == 0, err
    assert "draft: " in err


# mlxcel list


def test_list_shows_the_built_in_model_and_the_store_as_a_table_json_and_names(
    tmp_path, environ, smollm2_path
):
    empty = f"mlxcel: no models in the store {tmp_path / 'mlxcel' / 'models'}\n"
    code, out, err = run_cli("list", environ=environ)
    header, built_in = out.splitlines()
    assert (code, err) == (0, empty)
    assert built_in.startswith(f"{smollm2_path.name} (built in)") and "MiB" in built_in
    generate("-m", REPO, environ=environ)
    code, out, _ = run_cli("list", environ=environ)
    header, built_in, row = out.splitlines()
    assert code == 0 and header.split() == ["NAME", "SIZE", "MODIFIED"]
    assert built_in.startswith(smollm2_path.name)
    assert row.startswith(REPO) and "KiB" in row
    default, listed = json.loads(run_cli("list", "--json", environ=environ)[1])
    assert default["built_in"] is True and default["path"] == str(smollm2_path)
    assert default["size_bytes"] == smollm2_path.stat().st_size
    assert listed["id"] == REPO and listed["complete"] is True and listed["built_in"] is False
    assert listed["size_bytes"] > 300_000
    # The ids of the store only, which `mlxcel rm` takes.
    assert run_cli("list", "-q", environ=environ)[1] == f"{REPO}\n"
    code, _, err = run_cli("list", "-q", "--json", environ=environ)
    assert_one_line_error(code, err, 2, "pick one")


def test_list_refuses_a_store_that_is_a_file(tmp_path, environ):
    store = tmp_path / "store"
    store.write_text("not a folder")
    code, out, err = run_cli("list", "--models-dir", str(store), environ=environ)
    assert out == ""
    assert_one_line_error(code, err, 1, f"the model store {store} is a file, not a folder")


# mlxcel rm


def test_rm_with_yes_deletes_and_without_a_terminal_refuses(tmp_path, environ):
    generate("-m", REPO, environ=environ)
    code, _, err = run_cli("rm", REPO, environ=environ)
    assert_one_line_error(code, err, 1, "stdin is not a terminal to ask on; pass --yes")
    assert (tmp_path / "mlxcel" / "models" / REPO).is_dir()
    code, out, _ = run_cli("rm", REPO, "--yes", environ=environ)
    assert code == 0 and out.startswith(f"deleted {REPO} (")
    assert not (tmp_path / "mlxcel" / "models" / "test-org").exists()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("test-org/absent", "test-org/absent is not in the model store"),
        ("/etc", "/etc is not a model id"),
        ("../../etc", "../../etc is not a model id"),
        ("test-org/tiny:Q8_0", "rm deletes a whole model"),
    ],
)
def test_rm_refuses_what_the_store_does_not_hold(environ, model, message):
    code, _, err = run_cli("rm", model, "--yes", environ=environ)
    assert_one_line_error(code, err, 1, message)


def test_rm_refuses_a_link_that_leads_outside_the_store(tmp_path, environ):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (tmp_path / "mlxcel" / "models" / "test-org").mkdir(parents=True)
    os.symlink(outside, tmp_path / "mlxcel" / "models" / REPO)
    code, _, err = run_cli("rm", REPO, "--yes", environ=environ)
    assert_one_line_error(code, err, 1, "refusing to touch")
    assert (outside / "keep.txt").is_file()


@pytest.fixture
def terminal_stdin(monkeypatch):
    """Make stdin a pseudo-terminal; returns a function typing a line into it."""
    controller, terminal = pty.openpty()
    stdin = os.fdopen(terminal, "r")
    monkeypatch.setattr(sys, "stdin", stdin)
    yield lambda line: os.write(controller, line.encode() + b"\n")
    stdin.close()
    os.close(controller)


def test_rm_asks_on_a_terminal(tmp_path, environ, terminal_stdin):
    generate("-m", REPO, environ=environ)
    terminal_stdin("n")
    code, _, err = run_cli("rm", REPO, environ=environ)
    assert code == 1
    assert f"delete {REPO} (" in err and f"kept {REPO}" in err
    assert (tmp_path / "mlxcel" / "models" / REPO).is_dir()
    terminal_stdin("y")
    code, out, _ = run_cli("rm", REPO, environ=environ)
    assert code == 0 and out.startswith(f"deleted {REPO}")
    assert not (tmp_path / "mlxcel" / "models" / REPO).exists()


# mlxcel arch


def test_arch_lists_the_families_and_what_they_support():
    code, out, _ = run_cli("arch", environ={})
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line}
    text_families = {"llama", "mistral", "qwen2", "qwen3"}
    assert text_families | {"qwen2_vl", "qwen2_5_vl"} <= set(rows)
    architectures = json.loads(run_cli("arch", "--json", environ={})[1])
    by_name = {entry["architecture"]: entry for entry in architectures}
    for name in ("qwen2_vl", "qwen2_5_vl"):
        assert by_name[name]["inputs"] == ["text", "vision"]
        assert by_name[name]["formats"] == ["safetensors"]
    for entry in (by_name[name] for name in text_families):
        assert entry["inputs"] == ["text"]
        assert entry["lora"] is True
        assert entry["tensor_parallel"] is True
        assert entry["pipeline_parallel"] is True
    formats = {entry["architecture"]: entry["formats"] for entry in architectures}
    assert formats["mistral"] == ["safetensors"]
    assert formats["llama"] == ["gguf", "safetensors"]


def test_arch_sorts_names_whatever_their_case_and_filters_by_name():
    code, out, _ = run_cli("arch", environ={})
    names = [line.split()[0] for line in out.splitlines()[1:] if line and " " in line]
    table = names[: names.index("not")] if "not" in names else names
    assert table == sorted(table, key=str.lower)
    code, out, _ = run_cli("arch", "QWEN3", "klear", environ={})
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["Klear", "qwen3"]
    assert_one_line_error(*run_cli("arch", "qwen3", "nosuch", environ={})[::2], 2, "nosuch")


def test_arch_marks_the_families_the_engine_refuses_without_internal_names():
    code, out, _ = run_cli("arch", "deepseek_v41", environ={})
    assert code == 0
    row = out.splitlines()[1].split()
    assert row[:4] == ["deepseek_v41", "text", "safetensors", "not"]
    assert row[-6:] == ["no"] * 6  # paged KV, prefix cache, speculative, LoRA, TP, PP
    assert "not supported: deepseek_v41: its layers keep a cache of their own kind" in out
    assert "LayerCache" not in out
    (entry,) = json.loads(run_cli("arch", "--json", "deepseek_v41", environ={})[1])
    assert entry["supported"] is False and entry["lora"] is False and entry["layers"] == []
    assert "cache of their own kind" in entry["unsupported_reason"]
