"""The model store: reference parsing, file selection, downloads from a local Hub, the
Hugging Face cache, listing and removal."""

import os
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.store import (
    ModelReference,
    StoreConfig,
    StoreError,
    find_stored_model,
    list_stored_models,
    parse_hub_id,
    parse_model_reference,
    remove_stored_model,
    resolve_model,
)
from mlxcel_models.store.selection import select_files

from factories import TinyConfig, write_safetensors_model
from hf_hub_server import HubServer, folder_files

REPO = "test-org/tiny"


@pytest.fixture
def hub(tiny_safetensors):
    with HubServer() as server:
        server.add_repo(REPO, folder_files(tiny_safetensors))
        yield server


def store_config(tmp_path: Path, hub: HubServer, **overrides) -> StoreConfig:
    settings = {
        "models_dir": tmp_path / "store",
        "hf_cache_dir": tmp_path / "hf" / "hub",
        "endpoint": hub.url,
        **overrides,
    }
    return StoreConfig(**settings)


def requests_for_files(hub: HubServer) -> list[str]:
    return [
        f"{r.method} {r.path.rsplit('/', 1)[-1]}" for r in hub.requests if "/resolve/" in r.path
    ]


# Parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("owner/name", ModelReference("owner/name")),
        ("SmolLM2-135M-Instruct", ModelReference("mlx-community/SmolLM2-135M-Instruct")),
        ("owner/name-GGUF:Q8_0", ModelReference("owner/name-GGUF", "Q8_0")),
        ("/abs/model", None),
        ("./model", None),
        ("~/model", None),
        ("a/b/c", None),
        ("model.gguf", None),
        ("owner/na--me", None),
        ("owner/name:Q8 0", None),
    ],
)
def test_references_are_ids_or_paths(text, expected):
    assert parse_model_reference(text, "mlx-community") == expected


def test_an_existing_path_is_never_an_id(tmp_path, monkeypatch):
    (tmp_path / "owner" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse_model_reference("owner/name", "org") is None
    assert parse_hub_id("owner/name", "org") == ModelReference("owner/name")


# Choosing files

SAFETENSORS_REPO = [
    "README.md",
    ".gitattributes",
    "config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "pytorch_model.bin",
    "modeling_custom.py",
    "onnx/config.json",
]
GGUF_REPO = [
    "README.md",
    "model-Q4_0.gguf",
    "model-Q4_0_4_4.gguf",
    "model.Q8_0.gguf",
    "mmproj-model-f16.gguf",
    "model-Q4_K_M.gguf",
    "model-IQ2_XXS.gguf",
]


def test_a_safetensors_repository_gives_its_weights_config_and_tokenizer():
    selection = select_files(ModelReference("o/n"), SAFETENSORS_REPO)
    assert selection.gguf_file is None
    assert set(selection.files) == {
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    }


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        (None, "model-Q4_K_M.gguf"),
        ("Q4_0", "model-Q4_0.gguf"),
        ("q8_0", "model.Q8_0.gguf"),
        ("IQ2_XXS", "model-IQ2_XXS.gguf"),
    ],
)
def test_a_gguf_file_is_chosen_by_tag_or_by_the_default_order(quant, expected):
    selection = select_files(ModelReference("o/n", quant), GGUF_REPO)
    assert selection.files == (expected,)
    assert selection.gguf_file == expected


def test_a_missing_quant_lists_the_gguf_files():
    with pytest.raises(ModelLoadError, match="no F16 GGUF file") as raised:
        select_files(ModelReference("o/n", "F16"), GGUF_REPO)
    assert "model-Q4_K_M.gguf" in str(raised.value)
    assert "mmproj" not in str(raised.value)


def test_gguf_files_of_no_default_type_are_listed():
    listed = r"pick one with o/n:QUANT from: a-IQ3_S\.gguf, a-Q5_0\.gguf"
    with pytest.raises(ModelLoadError, match=listed):
        select_files(ModelReference("o/n"), ["a-Q5_0.gguf", "a-IQ3_S.gguf"])


def test_a_repository_without_a_model_is_refused():
    with pytest.raises(ModelLoadError, match="neither a safetensors model"):
        select_files(ModelReference("o/n"), ["README.md", "pytorch_model.bin", "config.json"])


# Downloads


@pytest.fixture(scope="module")
def larger_safetensors(tmp_path_factory):
    """A 14 MB model: huggingface_hub writes what it receives in 10 MiB chunks, so only a
    transfer broken off past the first chunk leaves bytes to resume from."""
    folder = tmp_path_factory.mktemp("larger") / "model"
    return write_safetensors_model(folder, TinyConfig(hidden_size=256, intermediate_size=2048))


def test_an_interrupted_transfer_resumes_with_a_range_request(tmp_path, hub, larger_safetensors):
    hub.add_repo("test-org/larger", folder_files(larger_safetensors))
    weights = (larger_safetensors / "model.safetensors").read_bytes()
    cut = len(weights) * 4 // 5
    hub.break_next_get("model.safetensors", cut)
    path = resolve_model("test-org/larger", store_config(tmp_path, hub))
    first, second = hub.gets_of("model.safetensors")
    assert "range" not in first.headers
    start = int(second.headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= cut
    assert (path / "model.safetensors").read_bytes() == weights
    assert folder_files(larger_safetensors) == {
        name: data for name, data in folder_files(path).items() if not name.startswith(".")
    }


def test_a_stored_model_loads_again_without_a_request(tmp_path, hub):
    config = store_config(tmp_path, hub)
    first = resolve_model(REPO, config)
    hub.requests.clear()
    assert resolve_model(REPO, config) == first
    assert resolve_model("tiny", store_config(tmp_path, hub, default_org="test-org")) == first
    assert hub.requests == []


def test_a_failed_run_keeps_the_files_that_arrived(tmp_path, hub):
    config = store_config(tmp_path, hub)
    hub.fail_next_get("model.safetensors")
    with pytest.raises(ModelLoadError, match=f"cannot download {REPO}: the Hub answered 500"):
        resolve_model(REPO, config)
    hub.requests.clear()
    path = resolve_model(REPO, config)
    assert requests_for_files(hub) == ["HEAD model.safetensors", "GET model.safetensors"]
    assert (path / "model.safetensors").is_file()


def test_offline_a_missing_model_fails_naming_it(tmp_path, hub):
    with pytest.raises(ModelLoadError, match=f"{REPO} is neither in the model store") as raised:
        resolve_model(REPO, store_config(tmp_path, hub, offline=True))
    assert "HF_HUB_OFFLINE" in str(raised.value)
    assert hub.requests == []


def test_offline_another_revision_than_the_stored_one_is_named(tmp_path, hub):
    resolve_model(REPO, store_config(tmp_path, hub))
    offline = store_config(tmp_path, hub, offline=True)
    with pytest.raises(ModelLoadError, match=f"^{REPO} at revision 'v2' is neither in the model"):
        resolve_model(REPO, offline, revision="v2")
    assert resolve_model(REPO, offline, revision="main").is_dir()


def test_a_model_in_the_hugging_face_cache_is_used_in_place(tmp_path, hub):
    config = store_config(tmp_path, hub, offline=True)
    snapshot = snapshot_download(REPO, cache_dir=config.hf_cache_dir, endpoint=hub.url)
    hub.requests.clear()
    assert resolve_model(REPO, config) == Path(snapshot)
    assert hub.requests == []
    assert not config.models_dir.exists()


def test_a_partial_hugging_face_cache_snapshot_is_not_used(tmp_path, hub):
    config = store_config(tmp_path, hub)
    snapshot_download(
        REPO, cache_dir=config.hf_cache_dir, endpoint=hub.url, allow_patterns=["*.json"]
    )
    assert resolve_model(REPO, config) == config.models_dir / REPO


def test_a_revision_is_fetched_and_replaces_the_stored_one(tmp_path, hub, tiny_safetensors):
    files = folder_files(tiny_safetensors)
    tagged = {**files, "config.json": files["config.json"].replace(b"llama", b"llama ")}
    commit = hub.repos[REPO].add_commit(tagged, refs=("v1",))
    config = store_config(tmp_path, hub)
    path = resolve_model(REPO, config, revision="v1")
    assert any(r.path == f"/api/models/{REPO}/revision/v1" for r in hub.requests)
    assert (path / "config.json").read_bytes() == tagged["config.json"]
    hub.requests.clear()
    assert resolve_model(REPO, config, revision=commit) == path
    assert hub.requests == []
    resolve_model(REPO, config)
    assert (path / "config.json").read_bytes() == files["config.json"]


def test_a_gguf_repository_downloads_only_the_file_asked_for(tmp_path, hub, tiny_gguf):
    data = tiny_gguf.read_bytes()
    hub.add_repo("test-org/tiny-GGUF", {"tiny-Q8_0.gguf": data, "tiny-Q4_K_M.gguf": data})
    config = store_config(tmp_path, hub)
    path = resolve_model("test-org/tiny-GGUF:Q8_0", config)
    assert path == config.models_dir / "test-org" / "tiny-GGUF" / "tiny-Q8_0.gguf"
    assert requests_for_files(hub) == ["HEAD tiny-Q8_0.gguf", "GET tiny-Q8_0.gguf"]
    hub.requests.clear()
    assert resolve_model("test-org/tiny-GGUF", config).name == "tiny-Q4_K_M.gguf"
    assert requests_for_files(hub) == ["HEAD tiny-Q4_K_M.gguf", "GET tiny-Q4_K_M.gguf"]
    hub.requests.clear()
    assert resolve_model("test-org/tiny-GGUF:Q8_0", config) == path
    assert hub.requests == []


@pytest.mark.parametrize(
    ("model", "revision", "message"),
    [
        ("test-org/absent", None, "no model test-org/absent on http://"),
        (REPO, "v9", f"{REPO} has no revision 'v9'"),
    ],
)
def test_unknown_repositories_and_revisions_are_named(tmp_path, hub, model, revision, message):
    with pytest.raises(ModelLoadError, match=message):
        resolve_model(model, store_config(tmp_path, hub), revision=revision)


def test_an_unreachable_hub_is_one_error(tmp_path):
    with HubServer() as gone:
        endpoint = gone.url
    config = StoreConfig(tmp_path / "store", tmp_path / "hf", endpoint=endpoint)
    with pytest.raises(ModelLoadError, match=f"{REPO}: {endpoint} cannot be reached"):
        resolve_model(REPO, config)


# Listing and removal


def test_listing_and_removal(tmp_path, hub):
    config = store_config(tmp_path, hub)
    path = resolve_model(REPO, config)
    (config.models_dir / "test-org" / "partial").mkdir()
    models = list_stored_models(config.models_dir)
    assert [(m.repo_id, m.complete) for m in models] == [
        ("test-org/partial", False),
        (REPO, True),
    ]
    assert models[1].size_bytes == sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    remove_stored_model(find_stored_model(config.models_dir, REPO))
    assert not path.exists()
    assert (config.models_dir / "test-org").is_dir()
    remove_stored_model(find_stored_model(config.models_dir, "test-org/partial"))
    assert list(config.models_dir.iterdir()) == []


def test_removal_refuses_what_leads_outside_the_store(tmp_path):
    outside = tmp_path / "outside" / "name"
    outside.mkdir(parents=True)
    store = tmp_path / "store"
    (store / "linked").mkdir(parents=True)
    os.symlink(outside, store / "linked" / "name")
    os.symlink(outside.parent, store / "owner")
    for repo_id in ("linked/name", "owner/name"):
        with pytest.raises(StoreError, match="refusing to touch"):
            find_stored_model(store, repo_id)
    with pytest.raises(StoreError, match="not in the model store"):
        find_stored_model(store, "absent/name")
    assert outside.is_dir()
