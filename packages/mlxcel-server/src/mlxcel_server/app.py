"""`create_app`: the Quart app with its blueprints, authentication, CORS and error mapping."""

from __future__ import annotations

import hmac
import logging

from quart import Quart, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from mlxcel_server.anthropic_api.errors import (
    anthropic_error_body,
    anthropic_status,
    is_anthropic_path,
)
from mlxcel_server.errors import ApiError
from mlxcel_server.routes import (
    audio,
    chat,
    completions,
    lora,
    messages,
    metrics,
    models,
    native_completion,
    openapi,
    props,
    responses,
    tokenize,
    webui,
)
from mlxcel_server.settings import ServerSettings
from mlxcel_server.state import ServerState

logger = logging.getLogger(__name__)

# Paths anyone may call without a key: load balancers probe health unauthenticated. The
# web page's files are public too: the page asks for the key and sends it with its requests.
_PUBLIC_PATHS = frozenset({"/health"})


def _error_response(error: ApiError) -> Response:
    if is_anthropic_path(request.path):
        response = jsonify(anthropic_error_body(error))
        response.status_code = anthropic_status(error)
    else:
        response = jsonify(error.body())
        response.status_code = error.status
    response.headers.update(error.headers)
    return response


def _key_matches(given: str, keys: tuple[str, ...]) -> bool:
    # Compare against every key so the time taken does not reveal which one nearly matched.
    given_bytes = given.encode()
    matches = [hmac.compare_digest(given_bytes, key.encode()) for key in keys]
    return any(matches)


def create_app(state: ServerState, settings: ServerSettings) -> Quart:
    """Build the OpenAI-compatible app.

    Args:
        state: the model and engine, filled in once loading is done (503 until then).
        settings: server settings.

    Returns:
        The Quart app; its `after_serving` hook shuts the engine down.
    """
    app = Quart("mlxcel_server")
    # Audio uploads have their own, larger limit; the other routes are held to theirs below.
    app.config["MAX_CONTENT_LENGTH"] = max(settings.max_body_bytes, settings.audio_max_bytes)
    # Generation can outlast Quart's default timeouts; the server's own timeout applies.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = None
    app.register_blueprint(chat.make_blueprint(state, settings))
    app.register_blueprint(completions.make_blueprint(state, settings))
    app.register_blueprint(native_completion.make_blueprint(state, settings))
    app.register_blueprint(models.make_blueprint(state))
    app.register_blueprint(tokenize.make_blueprint(state))
    app.register_blueprint(metrics.make_blueprint(state, settings))
    app.register_blueprint(props.make_blueprint(state, settings))
    app.register_blueprint(lora.make_blueprint(state))
    app.register_blueprint(audio.make_blueprint(state, settings))
    app.register_blueprint(responses.make_blueprint(state, settings))
    app.register_blueprint(messages.make_blueprint(state, settings))
    app.register_blueprint(openapi.make_blueprint())
    if settings.webui:
        app.register_blueprint(webui.make_blueprint(settings.static_path))

    @app.before_request
    async def authenticate() -> Response | None:
        if not settings.api_keys or request.method == "OPTIONS":
            return None
        if request.path in _PUBLIC_PATHS or request.blueprint == webui.BLUEPRINT_NAME:
            return None
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            # Anthropic's clients send the key as `x-api-key`.
            key = request.headers.get("x-api-key", "")
        if not _key_matches(key.strip(), settings.api_keys):
            raise ApiError(401, "invalid or missing API key", code="invalid_api_key")
        return None

    def body_limit() -> int:
        is_audio = request.path.startswith(("/v1/audio/", "/audio/"))
        return settings.audio_max_bytes if is_audio else settings.max_body_bytes

    @app.before_request
    async def check_body_size() -> None:
        limit = body_limit()
        length = request.content_length
        if length is None and limit < app.config["MAX_CONTENT_LENGTH"]:
            # A body of unknown length (chunked) is read now and measured; it stays cached.
            length = len(await request.get_data(cache=True))
        if (length or 0) > limit:
            raise ApiError(413, f"the request body is larger than {limit} bytes")

    @app.after_request
    async def add_cors_headers(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if origin and ("*" in settings.cors_origins or origin in settings.cors_origins):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Headers"] = (
                "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"
            )
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            response.headers["Vary"] = "Origin"
        return response

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> Response:
        return _error_response(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        message = {
            404: f"no endpoint {request.method} {request.path}",
            405: f"{request.method} is not allowed on {request.path}",
            413: f"the request body is larger than {body_limit()} bytes",
        }.get(status, error.description or error.name)
        return _error_response(ApiError(status, message))

    @app.errorhandler(Exception)
    async def unexpected_error(error: Exception) -> Response:
        # A bug, not bad input: log it in full, tell the client only that it happened.
        logger.error("unhandled error on %s %s", request.method, request.path, exc_info=error)
        return _error_response(ApiError(500, "internal server error; see the server log"))

    @app.after_serving
    async def shutdown_engine() -> None:
        state.close()

    return app
