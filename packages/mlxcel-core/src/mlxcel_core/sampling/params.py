"""Sampling settings with llama-server's defaults, and parsing of its sampler-order syntax.

Reference: llama.cpp `common/common.h` (`common_params_sampling`) and `common/sampling.cpp`
(`common_sampler_types_from_names`, `common_sampler_types_from_chars`).
"""

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import NoReturn

from mlxcel_core.errors import ParamError


class SamplerStage(StrEnum):
    """A stage of the sampler chain, valued by its canonical llama.cpp name."""

    PENALTIES = "penalties"
    DRY = "dry"
    TOP_N_SIGMA = "top_n_sigma"
    TOP_K = "top_k"
    TYPICAL_P = "typ_p"
    TOP_P = "top_p"
    MIN_P = "min_p"
    XTC = "xtc"
    TEMPERATURE = "temperature"


DEFAULT_SAMPLERS: tuple[SamplerStage, ...] = tuple(SamplerStage)
"""llama-server's default stage order (`--sampling-seq edskypmxt`)."""

_SAMPLER_NAMES: Mapping[str, SamplerStage] = MappingProxyType(
    {
        **{stage.value: stage for stage in SamplerStage},
        "top-k": SamplerStage.TOP_K,
        "top-p": SamplerStage.TOP_P,
        "nucleus": SamplerStage.TOP_P,
        "top-n-sigma": SamplerStage.TOP_N_SIGMA,
        "typical_p": SamplerStage.TYPICAL_P,
        "typical-p": SamplerStage.TYPICAL_P,
        "typical": SamplerStage.TYPICAL_P,
        "typ-p": SamplerStage.TYPICAL_P,
        "typ": SamplerStage.TYPICAL_P,
        "min-p": SamplerStage.MIN_P,
        "temp": SamplerStage.TEMPERATURE,
    }
)

_SAMPLER_CHARS: Mapping[str, SamplerStage] = MappingProxyType(
    {
        "e": SamplerStage.PENALTIES,
        "d": SamplerStage.DRY,
        "s": SamplerStage.TOP_N_SIGMA,
        "k": SamplerStage.TOP_K,
        "y": SamplerStage.TYPICAL_P,
        "p": SamplerStage.TOP_P,
        "m": SamplerStage.MIN_P,
        "x": SamplerStage.XTC,
        "t": SamplerStage.TEMPERATURE,
    }
)

_UINT64_LIMIT = 2**64


def parse_sampler_names(names: Iterable[str]) -> tuple[SamplerStage, ...]:
    """Map llama.cpp sampler names, canonical or alias, to stages.

    Accepts the canonical names (`penalties`, `dry`, `top_n_sigma`, `top_k`, `typ_p`, `top_p`,
    `min_p`, `xtc`, `temperature`) and llama.cpp's aliases (`top-k`, `top-p`, `nucleus`,
    `top-n-sigma`, `typical-p`, `typical`, `typ-p`, `typ`, `min-p`, `temp`), plus `typical_p`.

    Args:
        names: Sampler names; surrounding whitespace is ignored.

    Returns:
        The stages, in the given order.

    Raises:
        ParamError: A name is unknown (llama.cpp's `infill` and `adaptive_p` included, which
            mlxcel does not implement); the message lists the valid names.
    """
    order = []
    for raw in names:
        stage = _SAMPLER_NAMES.get(raw.strip())
        if stage is None:
            valid = ", ".join(_SAMPLER_NAMES)
            raise ParamError(
                "samplers", f"samplers: unknown sampler name {raw!r}; valid names: {valid}"
            )
        order.append(stage)
    return tuple(order)


def parse_sampler_chars(chars: str) -> tuple[SamplerStage, ...]:
    """Map llama.cpp's `--sampling-seq` letters to stages.

    The letters follow llama.cpp `common_sampler_type_to_chr`: e=penalties, d=dry,
    s=top_n_sigma, k=top_k, y=typ_p, p=top_p, m=min_p, x=xtc, t=temperature; the default
    order is "edskypmxt".

    Args:
        chars: One letter per stage.

    Returns:
        The stages, in the given order.

    Raises:
        ParamError: A letter is unknown (llama.cpp's `i` infill and `a` adaptive-p included);
            the message lists the valid letters.
    """
    order = []
    for char in chars:
        stage = _SAMPLER_CHARS.get(char)
        if stage is None:
            valid = ", ".join(f"{c}={s}" for c, s in _SAMPLER_CHARS.items())
            raise ParamError(
                "samplers", f"samplers: unknown sampler letter {char!r}; valid letters: {valid}"
            )
        order.append(stage)
    return tuple(order)


def parse_sampler_order(text: str) -> tuple[SamplerStage, ...]:
    """Parse a sampler order written in either of llama.cpp's syntaxes.

    `--samplers` takes names separated by ';' (`penalties;dry;top_k;temp`); `--sampling-seq`
    (and llama-server's string-valued `samplers` field) takes one letter per stage
    (`edskypmxt`). Text containing ';', or that is exactly one known name (`temp`, `typ`), is
    read as names, anything else as letters. Empty names (a trailing ';') are skipped.

    Args:
        text: The option's value.

    Returns:
        The stages, in order.

    Raises:
        ParamError: A name or letter is unknown; the message lists the valid ones.
    """
    stripped = text.strip()
    if ";" in stripped or stripped in _SAMPLER_NAMES:
        return parse_sampler_names(name for name in stripped.split(";") if name.strip())
    return parse_sampler_chars(stripped)


def is_greedy(temperature: float) -> bool:
    """Whether `temperature` means greedy decoding (argmax): at or below 0, as in llama.cpp."""
    return temperature <= 0.0


def _fail(name: str, allowed: str, value: object, *, param: str | None = None) -> NoReturn:
    raise ParamError(param or name, f"{name} must be {allowed}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# The sampler computes in float32: a larger magnitude would become infinite there.
FLOAT32_MAX = 3.4028234663852886e38


def _is_float32_finite(value: object) -> bool:
    return _is_number(value) and math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _check_finite(name: str, value: object) -> None:
    if not _is_float32_finite(value):
        _fail(name, f"a finite number of magnitude <= {FLOAT32_MAX:.7g}", value)


def _check_positive(name: str, value: object, *, allow_zero: bool) -> None:
    _check_finite(name, value)
    if value < 0 or (value == 0 and not allow_zero):
        _fail(name, "a number >= 0" if allow_zero else "a number > 0", value)


def _check_range(name: str, value: object, low: float, high: float) -> None:
    if not _is_number(value) or not low <= value <= high:
        _fail(name, f"a number in [{low}, {high}]", value)


def _check_int_at_least(name: str, value: object, low: int) -> None:
    if not _is_int(value) or value < low:
        _fail(name, f"an integer >= {low}", value)


def _check_logit_bias(logit_bias: Mapping[int, float]) -> None:
    for token, bias in logit_bias.items():
        if not _is_int(token) or token < 0:
            _fail("logit_bias token id", "an integer >= 0", token, param="logit_bias")
        if not (_is_float32_finite(bias) or bias == -math.inf):
            _fail(
                f"logit_bias[{token}]",
                f"-inf or a number of magnitude <= {FLOAT32_MAX:.7g}",
                bias,
                param="logit_bias",
            )


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, named and defaulted as in llama-server.

    Attributes:
        temperature: Divides the logits at the `temperature` stage; <= 0 means greedy (argmax).
        top_k: Keep the k most likely tokens; 0 disables.
        top_p: Keep the smallest prefix of tokens whose probability reaches p; 1.0 disables.
        min_p: Keep tokens with probability >= min_p * max probability; 0.0 disables.
        typical_p: Locally typical sampling mass; 1.0 disables.
        top_n_sigma: Keep logits within n standard deviations of the maximum; <= 0 disables.
        xtc_probability: Chance per step that XTC removes the top choices; 0.0 disables.
        xtc_threshold: Probability a token needs to count as a top choice; > 0.5 disables XTC.
        repeat_penalty: Repetition penalty factor (Keskar et al. 2019); 1.0 disables.
        repeat_last_n: Tokens of history the penalties look at; 0 disables, -1 = all.
        presence_penalty: Subtracted once from tokens present in that window (OpenAI).
        frequency_penalty: Subtracted per occurrence in that window (OpenAI).
        dry_multiplier: DRY penalty scale; 0.0 disables.
        dry_base: DRY exponential base; below 1.0 disables DRY, as in llama.cpp.
        dry_allowed_length: Longest repetition DRY leaves unpenalised, in tokens.
        dry_penalty_last_n: Tokens of history DRY scans; 0 disables, -1 = all.
        dry_sequence_breakers: Strings that end a repetition; the caller maps them to token
            ids (see `Sampler`).
        logit_bias: Token id -> value added to its logit before every stage; -inf bans it.
        samplers: Stage order; canonical names are accepted and stored as `SamplerStage`.
        seed: Seed of the request's random stream; None draws a random one.

    Raises:
        ParamError: On construction, carrying the field's name (`param`); the message names
            it, its allowed range and the value.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    logit_bias: Mapping[int, float] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    samplers: tuple[SamplerStage, ...] = DEFAULT_SAMPLERS
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        """Whether the request decodes greedily (`is_greedy` of its temperature)."""
        return is_greedy(self.temperature)

    def __post_init__(self) -> None:
        _check_finite("temperature", self.temperature)
        _check_int_at_least("top_k", self.top_k, 0)
        _check_range("top_p", self.top_p, 0.0, 1.0)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("typical_p", self.typical_p, 0.0, 1.0)
        _check_finite("top_n_sigma", self.top_n_sigma)
        _check_range("xtc_probability", self.xtc_probability, 0.0, 1.0)
        _check_range("xtc_threshold", self.xtc_threshold, 0.0, 1.0)
        _check_positive("repeat_penalty", self.repeat_penalty, allow_zero=False)
        _check_int_at_least("repeat_last_n", self.repeat_last_n, -1)
        _check_finite("presence_penalty", self.presence_penalty)
        _check_finite("frequency_penalty", self.frequency_penalty)
        _check_positive("dry_multiplier", self.dry_multiplier, allow_zero=True)
        _check_positive("dry_base", self.dry_base, allow_zero=True)
        _check_int_at_least("dry_allowed_length", self.dry_allowed_length, 0)
        _check_int_at_least("dry_penalty_last_n", self.dry_penalty_last_n, -1)
        breakers = self.dry_sequence_breakers
        if isinstance(breakers, str) or not all(isinstance(b, str) and b for b in breakers):
            _fail("dry_sequence_breakers", "a sequence of non-empty strings", breakers)
        object.__setattr__(self, "dry_sequence_breakers", tuple(breakers))
        _check_logit_bias(self.logit_bias)
        object.__setattr__(self, "logit_bias", MappingProxyType(dict(self.logit_bias)))
        if isinstance(self.samplers, str):
            _fail("samplers", "a sequence of stage names", self.samplers)
        valid_stages = tuple(stage.value for stage in SamplerStage)
        for name in self.samplers:
            if name not in valid_stages:
                _fail("samplers", f"stage names from {valid_stages}", name)
        samplers = tuple(SamplerStage(name) for name in self.samplers)
        object.__setattr__(self, "samplers", samplers)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < _UINT64_LIMIT):
            _fail("seed", f"None or an integer in [0, {_UINT64_LIMIT})", self.seed)
