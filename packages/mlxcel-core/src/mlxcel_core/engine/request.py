"""What goes into the engine and what comes out: requests, outputs, sinks and errors."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Protocol

from mlxcel_core.adapters import AdapterScales
from mlxcel_core.errors import InputError, MlxcelError
from mlxcel_core.images import PromptImage, check_prompt_images
from mlxcel_core.logprobs import TokenLogprobs
from mlxcel_core.request import Detokenizer, FinishReason, GenerationConfig, GenerationStats
from mlxcel_core.sampling import SamplingParams, TokenConstraint


class EngineError(MlxcelError):
    """Base of the errors the engine reports for a request."""


class EngineOverloadedError(EngineError):
    """The waiting queue is full; the caller should retry later.

    Attributes:
        retry_after_seconds: a hint for how long to wait before retrying.
    """

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class EngineClosedError(EngineError):
    """The engine is shutting down: the request was refused or ended early."""


class EngineUnavailableError(EngineError):
    """A part of the model that runs elsewhere (another rank) is gone or does not answer;
    the message names it. The engine cannot run steps again."""


class RequestCancelledError(EngineError):
    """The request was cancelled by its submitter (e.g. the client disconnected)."""


class ImagesNotSupportedError(InputError, ValueError):
    """A request holds images the engine cannot run: the model has no vision support, or
    it runs across ranks, whose messages carry token ids only. The message says which."""


@dataclass(frozen=True)
class EngineRequest:
    """One sequence to generate.

    Attributes:
        prompt_ids: the prompt's token ids, at least one.
        sampling: the sampler settings; the engine builds the `Sampler` on its thread.
        generation: context size, token limit and stop criteria.
        detokenizer: a fresh incremental detokenizer owned by this request.
        dry_breaker_ids: token ids that end a DRY repetition (see `Sampler`).
        index: the choice this sequence answers (OpenAI's `choices[i].index`); outputs carry it.
        constraint: a token constraint owned by this request (structured output), or None.
        adapter_scales: one scale per loaded LoRA adapter for this request, or None for the
            adapters' global scales when it arrives (see `RowAdapterScales`).
        images: the prompt's images, in position order: each fills a run of placeholder
            tokens in `prompt_ids` (see `PromptImage`); only a model with vision support
            takes them.
        use_prefix_cache: False computes the whole prompt even where the prefix cache holds
            it (llama-server's `cache_prompt: false`); its blocks still join the cache.

    Raises:
        ValueError: `prompt_ids` is empty, `index` is negative, a scale is not finite, or
            an image lies outside the prompt, out of order or over another one.
    """

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    generation: GenerationConfig
    detokenizer: Detokenizer
    dry_breaker_ids: frozenset[int] = frozenset()
    index: int = 0
    constraint: TokenConstraint | None = None
    adapter_scales: AdapterScales | None = None
    images: tuple[PromptImage, ...] = ()
    use_prefix_cache: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))
        object.__setattr__(self, "images", tuple(self.images))
        if not self.prompt_ids:
            raise ValueError("prompt_ids must hold at least one token")
        if self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index}")
        if self.adapter_scales is not None:
            object.__setattr__(self, "adapter_scales", tuple(map(float, self.adapter_scales)))
            if not all(math.isfinite(scale) for scale in self.adapter_scales):
                raise ValueError(f"adapter_scales must be finite, got {self.adapter_scales}")
        check_prompt_images(self.images, len(self.prompt_ids))


@dataclass(frozen=True)
class EngineOutput:
    """One step's output of one request.

    A request's last output is terminal: it has a `finish_reason` (generation ended normally)
    or an `error` (cancelled, engine closed, or a failure while generating).

    Attributes:
        index: the request's `EngineRequest.index`.
        text: newly final text; may be empty.
        token_id: the token sampled in this step, or None for the final flush.
        finish_reason: set on the last output of a normal finish.
        stats: the timings, set with `finish_reason`.
        seed: the seed of the request's sampler (reported back as llama-server does).
        error: set on the last output when the request did not finish normally.
        logprobs: `token_id`'s log probabilities when the request's
            `GenerationConfig.num_top_logprobs` is set; computed on the engine thread.
    """

    index: int
    text: str = ""
    token_id: int | None = None
    finish_reason: FinishReason | None = None
    stats: GenerationStats | None = None
    seed: int | None = None
    error: Exception | None = None
    logprobs: TokenLogprobs | None = None

    @property
    def finished(self) -> bool:
        """True on a request's terminal output."""
        return self.finish_reason is not None or self.error is not None


class OutputSink(Protocol):
    """Receives a group's outputs on the engine thread; `put` must not block."""

    def put(self, output: EngineOutput) -> None:
        """Deliver one output."""
        ...


@dataclass(eq=False)
class RequestHandle:
    """The submitter's hold on a group of requests: cancelling stops them all.

    Attributes:
        request_id: a number unique within the engine.
    """

    request_id: int
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        """Ask the engine to stop the group; it stops within one decode step.

        Requests that already finished are unaffected; the others end with an output whose
        `error` is a `RequestCancelledError`. Safe to call from any thread, more than once.
        """
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()
