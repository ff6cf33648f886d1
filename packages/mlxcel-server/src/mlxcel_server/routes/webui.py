"""The chat page at `/`, as llama-server serves its web UI: static files that need no API key.

The built-in page ships inside this package (`mlxcel_server/webui/`); `--path DIR` serves
another folder in its place. Each file of the folder is routed by its path relative to it,
listed once when the app is made (a file added later needs a restart; edits to a listed file
show at once), and `/` is the folder's `index.html`. Dot files and dot folders are left out.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path

from quart import Blueprint, Response, send_file

from mlxcel_server.errors import ApiError

BLUEPRINT_NAME = "webui"
BUILTIN_FOLDER = Path(__file__).resolve().parent.parent / "webui"

# The built-in page loads only its own files and talks only to this server, so even a
# rendering bug could not run a reply's markup as script or send it elsewhere.
BUILTIN_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "media-src 'self' blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)


def list_files(folder: Path) -> dict[str, Path]:
    """The files a folder serves, by URL path: `/name` for each file below it, and `/` for
    its `index.html`.

    Raises:
        ValueError: `folder` is not a directory.
    """
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a directory")
    files = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and not any(part.startswith(".") for part in relative.parts):
            files["/" + relative.as_posix()] = path
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files


def _view(path: Path, policy: str | None) -> Callable[[], Awaitable[Response]]:
    mimetype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"

    async def serve() -> Response:
        try:
            response = await send_file(path, mimetype=mimetype, conditional=True)
        except FileNotFoundError as error:
            raise ApiError(404, f"{path.name} is no longer in the served folder") from error
        # Revalidated on each load, so a new version of the page shows after an upgrade.
        response.headers["Cache-Control"] = "no-cache"
        if policy is not None:
            response.headers["Content-Security-Policy"] = policy
        return response

    return serve


def make_blueprint(static_path: Path | None) -> Blueprint:
    """The page's routes: the files of `static_path`, or of the built-in page when None.

    Raises:
        ValueError: `static_path` is not a directory.
    """
    folder = BUILTIN_FOLDER if static_path is None else static_path
    policy = BUILTIN_POLICY if static_path is None else None
    blueprint = Blueprint(BLUEPRINT_NAME, __name__)
    for number, (url, path) in enumerate(list_files(folder).items()):
        blueprint.add_url_rule(url, f"file_{number}", _view(path, policy), methods=["GET"])
    return blueprint
