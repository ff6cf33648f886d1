"""A local stand-in for the Hugging Face Hub, speaking the API huggingface_hub 2.4 uses.

`HubServer` serves repositories held in memory at the URLs huggingface_hub requests
(point `HF_ENDPOINT` or `StoreConfig.endpoint` at `server.url`):

- `GET /api/models/{repo}/revision/{revision}`: model info (`id`, `sha`, `siblings`);
- `GET /api/models/{repo}/tree/{revision}`: the file listing, one page;
- `HEAD|GET /{repo}/resolve/{revision}/{path}`: a file, with `ETag`, `X-Repo-Commit` and
  `Content-Length`, and `Range: bytes=N-` answered with 206.

Unknown repositories, revisions and files get the Hub's 404s with their `X-Error-Code`.
Every request is recorded; faults can be armed per file: a GET that breaks off after some
bytes (the connection closes mid-body), or a GET answered 500.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Commit:
    """The files of a repository at one commit (repository path -> bytes)."""

    sha: str
    files: dict[str, bytes]


@dataclass
class Repo:
    """A repository: its commits and the branches or tags naming them."""

    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def add_commit(self, files: dict[str, bytes], *, refs: tuple[str, ...] = ("main",)) -> str:
        """Add a commit holding `files`, named by `refs`; return its sha."""
        digest = hashlib.sha1(json.dumps(sorted(files)).encode() + b"".join(files.values()))
        sha = digest.hexdigest()
        self.commits[sha] = Commit(sha, dict(files))
        for ref in refs:
            self.refs[ref] = sha
        return sha

    def commit(self, revision: str) -> Commit | None:
        return self.commits.get(self.refs.get(revision, revision))


@dataclass(frozen=True)
class SeenRequest:
    """One request the server answered; header names in lower case."""

    method: str
    path: str
    headers: dict[str, str]


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of `folder`, by its path relative to it."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _etag(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(?P<start>\d+)-$")


class HubServer:
    """A threaded HTTP server on 127.0.0.1 holding `repos` (repo id -> `Repo`).

    Use as a context manager; `url` is its endpoint and `requests` what it was asked.
    """

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[SeenRequest] = []
        self._break_after: dict[str, int] = {}
        self._fail_once: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> str:
        """Publish `files` as the `main` commit of a new repository; return its sha."""
        self.repos[repo_id] = Repo()
        return self.repos[repo_id].add_commit(files)

    def break_next_get(self, path: str, after_bytes: int) -> None:
        """The next GET of the file `path` closes the connection after `after_bytes`."""
        self._break_after[path] = after_bytes

    def fail_next_get(self, path: str) -> None:
        """The next GET of the file `path` is answered 500."""
        self._fail_once.add(path)

    def gets_of(self, path: str) -> list[SeenRequest]:
        """The GET requests made for the file `path` of any repository."""
        return [r for r in self.requests if r.method == "GET" and r.path.endswith(f"/{path}")]

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(send_body=False)

            def do_GET(self) -> None:
                self._answer(send_body=True)

            def _answer(self, *, send_body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                with hub._lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    hub.requests.append(SeenRequest(self.command, path, headers))
                if match := _INFO.match(path):
                    self._model_info(match["repo"], match["rev"])
                elif match := _TREE.match(path):
                    self._tree(match["repo"], match["rev"])
                elif match := _RESOLVE.match(path):
                    self._file(match["repo"], match["rev"], match["file"], send_body)
                else:
                    self._error(404, "EntryNotFound")

            def _commit(self, repo_id: str, revision: str) -> Commit | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound")
                    return None
                commit = repo.commit(revision)
                if commit is None:
                    self._error(404, "RevisionNotFound")
                return commit

            def _model_info(self, repo_id: str, revision: str) -> None:
                if commit := self._commit(repo_id, revision):
                    siblings = [{"rfilename": name} for name in commit.files]
                    self._json({"id": repo_id, "sha": commit.sha, "siblings": siblings})

            def _tree(self, repo_id: str, revision: str) -> None:
                if commit := self._commit(repo_id, revision):
                    self._json(
                        [
                            {"type": "file", "path": name, "size": len(data), "oid": _etag(data)}
                            for name, data in commit.files.items()
                        ]
                    )

            def _file(self, repo_id: str, revision: str, name: str, send_body: bool) -> None:
                commit = self._commit(repo_id, revision)
                if commit is None:
                    return
                if name not in commit.files:
                    self._error(404, "EntryNotFound")
                    return
                if send_body and name in hub._fail_once:
                    hub._fail_once.discard(name)
                    self._error(500, "")
                    return
                data = commit.files[name]
                start = 0
                if send_body and (match := _RANGE.match(self.headers.get("Range", ""))):
                    start = int(match["start"])
                self.send_response(206 if start else 200)
                self.send_header("ETag", f'"{_etag(data)}"')
                self.send_header("X-Repo-Commit", commit.sha)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not send_body:
                    return
                cut = hub._break_after.pop(name, None)
                if cut is None:
                    self.wfile.write(data[start:])
                    return
                self.wfile.write(data[start : start + cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

            def _json(self, payload: object) -> None:
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _error(self, status: int, code: str) -> None:
                body = json.dumps({"error": code or "server error"}).encode()
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
