"""Server settings: parsed at the edge (command line, environment), frozen here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlxcel_core.engine import EngineConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_server.image_prompts import ImageDecoder
from mlxcel_server.reasoning import ReasoningFormat


@dataclass(frozen=True)
class ServerSettings:
    """What the app needs to know besides the model.

    Attributes:
        model_alias: the model's name in the API (`-a/--alias`); None uses the file name.
        context_size: the context window (tokens); 0 uses the model's trained context.
        n_predict: default token limit of a request; -1 = until the context is full.
        engine: the engine's limits and KV cache settings; its `context_size` is replaced
            by the served context size when the model is ready.
        sampling: per-request sampling defaults; request fields override them.
        api_keys: accepted bearer keys; empty means no authentication.
        cors_origins: origins allowed cross-origin access; "*" allows any.
        max_body_bytes: largest accepted request body (bytes); larger ones get 413.
        audio_max_bytes: largest accepted audio upload (bytes), the whole multipart body
            included; larger ones get 413.
        max_n: largest `n` (choices per prompt) a request may ask for.
        endpoint_metrics: serve `GET /metrics` (`--metrics`); off answers 501.
        endpoint_slots: serve `GET /slots` (`--slots`); off answers 501.
        endpoint_props: llama-server's `--props` (allow `POST /props`); mlxcel refuses
            property changes either way, with a message saying which.
        reasoning_format: where replies' reasoning goes (`--reasoning-format`); requests
            may override it with `reasoning_format`.
        reasoning_budget: most reasoning tokens per reply (`--reasoning-budget`); -1 means
            no limit, 0 disables reasoning.
        image_decoder: reads the images of chat requests under the operator's media policy
            (`--allowed-local-media-path`, `--media-fetch`, ...); None answers requests with
            images 501 (the vision extra is not installed).
        webui: serve the chat page at `/` (`--no-webui` turns it off).
        static_path: a folder served at `/` instead of the built-in chat page (`--path`);
            None serves the built-in page.

    Raises:
        ValueError: a value is out of range; the message names the field.
    """

    model_alias: str | None = None
    context_size: int = 4096
    n_predict: int = -1
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 16 * 2**20
    audio_max_bytes: int = 25 * 2**20
    max_n: int = 16
    endpoint_metrics: bool = False
    endpoint_slots: bool = False
    endpoint_props: bool = False
    reasoning_format: ReasoningFormat = ReasoningFormat.AUTO
    reasoning_budget: int = -1
    image_decoder: ImageDecoder | None = None
    webui: bool = True
    static_path: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reasoning_format", ReasoningFormat(self.reasoning_format))
        if self.context_size < 0:
            raise ValueError(f"context_size must be >= 0, got {self.context_size}")
        if self.n_predict < -1:
            raise ValueError(f"n_predict must be -1 or >= 0, got {self.n_predict}")
        if any(not key for key in self.api_keys):
            raise ValueError("api_keys must not hold an empty key")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.reasoning_budget < -1:
            raise ValueError(f"reasoning_budget must be -1 or >= 0, got {self.reasoning_budget}")
        if self.audio_max_bytes < 1:
            raise ValueError(f"audio_max_bytes must be >= 1, got {self.audio_max_bytes}")
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n}")
        if self.static_path is not None and not self.webui:
            raise ValueError("static_path is served as the web page, which webui turns off")
