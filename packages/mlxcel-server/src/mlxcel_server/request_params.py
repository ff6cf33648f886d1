"""Turning API fields into engine settings: sampling, token limits, stop strings."""

from __future__ import annotations

import dataclasses
import math

from mlxcel_core.adapters import AdapterScales
from mlxcel_core.errors import ParamError
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.sampling.params import parse_sampler_chars, parse_sampler_names
from mlxcel_models.lora import AdapterScaleError, LoraAdapters
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server.errors import invalid
from mlxcel_server.schemas import ChatCompletionRequest, CompletionRequest, GenerationFields
from mlxcel_server.settings import ServerSettings

_SAMPLING_FIELDS = (
    "temperature", "top_k", "top_p", "min_p", "typical_p", "top_n_sigma", "xtc_probability",
    "xtc_threshold", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
)  # fmt: skip
_SEED_LIMIT = 2**64
# OpenAI's limits on the alternatives reported per token.
_MAX_CHAT_TOP_LOGPROBS = 20
_MAX_COMPLETION_LOGPROBS = 5
# OpenAI: -100 "should result in a ban"; llama-server: `false` bans.
_BAN = -100.0


def _token_id(key: str) -> int:
    """A `logit_bias` key of digits as a token id.

    Raises:
        ApiError: 400 for digits Python will not convert (superscripts, or over 4,300).
    """
    try:
        return int(key)
    except ValueError as error:
        shown = key if len(key) <= 20 else f"{key[:20]}..."
        raise invalid(f"logit_bias: {shown!r} is not a token id", "logit_bias") from error


def _logit_bias(fields: GenerationFields, tokenizer: Tokenizer) -> dict[int, float]:
    bias: dict[int, float] = {}
    for key, value in (fields.logit_bias or {}).items():
        if value is True:
            raise invalid(f"logit_bias[{key!r}]: true is not a bias; use a number", "logit_bias")
        if value is not False and not -100 <= value <= 100:
            raise invalid(f"logit_bias[{key!r}] must be in [-100, 100], got {value}", "logit_bias")
        # Digits name a token id (OpenAI); other text names the tokens it encodes to.
        ids = [_token_id(key)] if key.isdigit() else tokenizer.encode(key, add_special_tokens=False)
        if not ids:
            raise invalid(f"logit_bias[{key!r}] names no token", "logit_bias")
        for token_id in ids:
            if not 0 <= token_id < tokenizer.vocab_size:
                raise invalid(
                    f"logit_bias: token id {token_id} is outside the vocabulary "
                    f"[0, {tokenizer.vocab_size})",
                    "logit_bias",
                )
            ban = value is False or value <= _BAN
            bias[token_id] = -math.inf if ban else float(value)
    return bias


def sampling_params(
    fields: GenerationFields, defaults: SamplingParams, tokenizer: Tokenizer
) -> SamplingParams:
    """The request's sampling settings: its fields over the server's defaults.

    Raises:
        ApiError: 400 naming the field whose value is out of range.
    """
    overrides: dict[str, object] = {
        name: getattr(fields, name)
        for name in _SAMPLING_FIELDS
        if getattr(fields, name) is not None
    }
    if fields.dry_sequence_breakers is not None:
        overrides["dry_sequence_breakers"] = tuple(fields.dry_sequence_breakers)
    if fields.seed is not None:
        if fields.seed != -1 and not 0 <= fields.seed < _SEED_LIMIT:
            raise invalid(f"seed must be -1 (random) or in [0, 2**64), got {fields.seed}", "seed")
        overrides["seed"] = None if fields.seed == -1 else fields.seed
    if fields.logit_bias is not None:
        overrides["logit_bias"] = _logit_bias(fields, tokenizer)
    if fields.samplers is not None:
        overrides["samplers"] = _samplers(fields.samplers)
    try:
        return dataclasses.replace(defaults, **overrides)
    except ParamError as error:
        raise invalid(str(error), error.param) from error


def _samplers(samplers: list[str] | str) -> tuple:
    """llama-server's `samplers`: a list of stage names, or a string of one letter each.

    Raises:
        ApiError: 400 naming `samplers` for an unknown name or letter.
    """
    try:
        if isinstance(samplers, str):
            return parse_sampler_chars(samplers)
        return parse_sampler_names(samplers)
    except ParamError as error:
        raise invalid(str(error), "samplers") from error


def choice_sampling(params: SamplingParams, choice: int) -> SamplingParams:
    """Settings of the `choice`-th of n choices: a seeded request seeds each one differently,
    so choices differ while two identical requests still return identical sets."""
    if params.seed is None or choice == 0:
        return params
    return dataclasses.replace(params, seed=(params.seed + choice) % _SEED_LIMIT)


def max_tokens(fields: GenerationFields, default: int) -> int:
    """The token limit: llama-server's `n_predict` (-1: until the context is full), else
    `max_completion_tokens`, else `max_tokens`, else the server's -n.

    Raises:
        ApiError: 400 naming the field when it is negative (`n_predict` below -1).
    """
    if fields.n_predict is not None:
        if fields.n_predict < -1:
            raise invalid(
                f"n_predict must be -1 (until the context is full) or >= 0, got {fields.n_predict}",
                "n_predict",
            )
        return fields.n_predict
    for name in ("max_completion_tokens", "max_tokens"):
        value = getattr(fields, name)
        if value is not None:
            if value < 0:
                raise invalid(f"{name} must be >= 0, got {value}", name)
            return value
    return default


def stop_strings(fields: GenerationFields) -> tuple[str, ...]:
    """`stop` as a tuple.

    Raises:
        ApiError: 400 when a stop string is empty.
    """
    stops = (fields.stop,) if isinstance(fields.stop, str) else tuple(fields.stop or ())
    if "" in stops:
        raise invalid("stop strings must not be empty", "stop")
    return stops


def check_n(fields: GenerationFields, settings: ServerSettings) -> None:
    """Raises: ApiError: 400 when `n` is outside [1, settings.max_n]."""
    if not 1 <= fields.n <= settings.max_n:
        raise invalid(f"n must be in [1, {settings.max_n}], got {fields.n}", "n")


def chat_num_top_logprobs(body: ChatCompletionRequest) -> int | None:
    """Alternatives per token a chat request asks for; None when it wants no logprobs.

    Raises:
        ApiError: 400 naming `top_logprobs` when out of [0, 20] or set without `logprobs`,
            or `n_probs` when negative. llama-server's `n_probs`, when the logprobs fields
            are left out, asks for that many alternatives (0 asks for none).
    """
    if body.n_probs is not None and body.logprobs is None and body.top_logprobs is None:
        if body.n_probs < 0:
            raise invalid(f"n_probs must be >= 0, got {body.n_probs}", "n_probs")
        return body.n_probs or None
    top = body.top_logprobs
    if top is not None and not 0 <= top <= _MAX_CHAT_TOP_LOGPROBS:
        raise invalid(
            f"top_logprobs must be in [0, {_MAX_CHAT_TOP_LOGPROBS}], got {top}", "top_logprobs"
        )
    if not body.logprobs:
        if top is not None:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return top or 0


def completion_num_logprobs(body: CompletionRequest) -> int | None:
    """Alternatives per token a completion request asks for; None when it wants no logprobs.

    Raises:
        ApiError: 400 naming `logprobs` when out of [0, 5] or combined with `echo`, or
            `n_probs` when negative. llama-server's `n_probs`, when `logprobs` is left out,
            asks for that many alternatives (0 asks for none).
    """
    if body.n_probs is not None and body.logprobs is None:
        if body.n_probs < 0:
            raise invalid(f"n_probs must be >= 0, got {body.n_probs}", "n_probs")
        return body.n_probs or None
    count = body.logprobs
    if count is None:
        return None
    if not 0 <= count <= _MAX_COMPLETION_LOGPROBS:
        raise invalid(
            f"logprobs must be in [0, {_MAX_COMPLETION_LOGPROBS}], got {count}", "logprobs"
        )
    if body.echo:
        raise invalid(
            "logprobs with echo (log probabilities of the prompt) is not supported", "logprobs"
        )
    return count


def generation_config(
    fields: GenerationFields,
    settings: ServerSettings,
    context_size: int,
    tokenizer: Tokenizer,
    *,
    num_top_logprobs: int | None = None,
) -> GenerationConfig:
    """Limits and stop criteria of each choice, and the log probabilities it reports.

    Raises:
        ApiError: 400 naming the field at fault.
    """
    if fields.min_tokens is not None and fields.min_tokens < 0:
        raise invalid(f"min_tokens must be >= 0, got {fields.min_tokens}", "min_tokens")
    time_limit = fields.t_max_predict_ms
    if time_limit is not None and time_limit < 0:
        raise invalid(f"t_max_predict_ms must be >= 0, got {time_limit}", "t_max_predict_ms")
    if fields.id_slot is not None and fields.id_slot < -1:
        raise invalid(f"id_slot must be -1 (any) or >= 0, got {fields.id_slot}", "id_slot")
    return GenerationConfig(
        context_size=context_size,
        max_tokens=max_tokens(fields, settings.n_predict),
        stop_token_ids=tokenizer.eos_token_ids,
        stop_strings=stop_strings(fields),
        num_top_logprobs=num_top_logprobs,
        min_tokens=fields.min_tokens or 0,
        ignore_eos=fields.ignore_eos,
        max_predict_seconds=time_limit / 1000 if time_limit else None,
    )


def adapter_scales(fields: GenerationFields, adapters: LoraAdapters | None) -> AdapterScales | None:
    """The request's LoRA adapter scales from its `lora` field (llama-server's semantics:
    adapters not listed get 0), or None for the server's global scales.

    Raises:
        ApiError: 400 naming `lora` when the server has no adapters, they are fused, or an
            id or scale is out of range.
    """
    if fields.lora is None:
        return None
    if adapters is None:
        raise invalid("this server has no LoRA adapters (start it with --lora)", "lora")
    try:
        return adapters.scales_from({entry.id: entry.scale for entry in fields.lora})
    except AdapterScaleError as error:
        raise invalid(f"lora: {error}", "lora") from error
