"""The chat page's routes without a browser: the built-in files and their headers, the page
turned off, another folder served in its place, the API key, and what `/props` tells the
page (vision, the speech models)."""

from __future__ import annotations

import pytest
from audio_app import AudioApps
from audio_fakes import FakeSpeechToText, FakeVoice

from mlxcel_server import ServerSettings
from mlxcel_server.routes.webui import BUILTIN_FOLDER, list_files

BUILTIN_FILES = {"index.html", "style.css", "app.js", "api.js", "markdown.js", "view.js",
                 "settings.js", "store.js", "audio.js"}  # fmt: skip


def test_the_builtin_page_is_at_the_root_with_its_files(client):
    page = client.get("/")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert b'<script type="module" src="app.js">' in page.body
    assert page.body == client.get("/index.html").body
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-cache"
    script = client.get("/app.js")
    assert script.status == 200 and "javascript" in script.headers["Content-Type"]
    assert client.get("/style.css").headers["Content-Type"].startswith("text/css")
    again = client.get("/app.js", headers={"If-None-Match": script.headers["ETag"]})
    assert again.status == 304


def test_every_builtin_file_is_routed():
    assert {url.lstrip("/") for url in list_files(BUILTIN_FOLDER)} == BUILTIN_FILES | {""}


def test_unknown_paths_and_methods_keep_their_errors(client):
    assert client.get("/nowhere.js").status == 404
    assert client.post("/v1/nowhere", {}).status == 404
    assert client.post("/index.html", {}).status == 405
    assert client.post("/v1/models", {}).status == 405


def test_no_webui_leaves_the_root_unanswered(make_client):
    client = make_client(webui=False)
    reply = client.get("/")
    assert reply.status == 404 and reply.json()["error"]["message"] == "no endpoint GET /"
    assert client.get("/app.js").status == 404
    assert client.get("/v1/models").status == 200


def test_another_folder_is_served_in_place_of_the_page(make_client, tmp_path):
    (tmp_path / "index.html").write_text("<p>mine</p>")
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "site.css").write_text("p { color: red; }")
    (tmp_path / ".secret").write_text("key")
    (tmp_path / "models").write_text("shadowed by the API")
    client = make_client(static_path=tmp_path)
    page = client.get("/")
    assert page.body == b"<p>mine</p>" and "Content-Security-Policy" not in page.headers
    assert client.get("/assets/site.css").body == b"p { color: red; }"
    assert client.get("/.secret").status == 404
    assert client.get("/app.js").status == 404
    assert client.get("/models").json()["object"] == "list"


def test_settings_refuse_a_folder_with_the_page_turned_off(tmp_path):
    with pytest.raises(ValueError, match="static_path"):
        ServerSettings(webui=False, static_path=tmp_path)


def test_the_page_needs_no_key_but_the_api_does(make_client):
    client = make_client(api_keys=("secret",))
    assert client.get("/").status == 200
    assert client.get("/markdown.js").status == 200
    assert client.get("/props").status == 401
    authorized = client.get("/props", headers={"Authorization": "Bearer secret"})
    assert authorized.status == 200


def test_props_tells_the_page_what_the_model_and_server_take(client, tiny_loaded):
    props = client.get("/props").json()
    assert props["modalities"] == {"vision": False, "audio": False}
    assert props["speech_models"] == {"stt": None, "tts": None}
    apps = AudioApps(tiny_loaded)
    try:
        speaking, _ = apps.make(stt=FakeSpeechToText(), tts=FakeVoice())
        assert speaking.get("/props").json()["speech_models"] == {
            "stt": "whisper-fake.en",
            "tts": "en_US-fake-medium",
        }
        listening, _ = apps.make(stt=FakeSpeechToText())
        assert listening.get("/props").json()["speech_models"]["tts"] is None
    finally:
        apps.close()
