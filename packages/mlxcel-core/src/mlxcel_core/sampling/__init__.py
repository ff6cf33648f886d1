"""The sampler chain of llama-server on MLX: logit bias, penalties, DRY, truncation, XTC,
temperature, and a per-request seeded draw; token constraints for structured output."""

from mlxcel_core.sampling.constraint import TokenConstraint, apply_constraint
from mlxcel_core.sampling.params import (
    DEFAULT_SAMPLERS,
    SamplerStage,
    SamplingParams,
    is_greedy,
    parse_sampler_chars,
    parse_sampler_names,
    parse_sampler_order,
)
from mlxcel_core.sampling.penalties import apply_dry, apply_logit_bias, apply_penalties
from mlxcel_core.sampling.sampler import Sampler, sample_batch
from mlxcel_core.sampling.stages import (
    apply_min_p,
    apply_temperature,
    apply_top_k,
    apply_top_n_sigma,
    apply_top_p,
    apply_typical_p,
    apply_xtc,
)

__all__ = [
    "DEFAULT_SAMPLERS",
    "Sampler",
    "SamplerStage",
    "SamplingParams",
    "TokenConstraint",
    "apply_constraint",
    "apply_dry",
    "apply_logit_bias",
    "apply_min_p",
    "apply_penalties",
    "apply_temperature",
    "apply_top_k",
    "apply_top_n_sigma",
    "apply_top_p",
    "apply_typical_p",
    "apply_xtc",
    "is_greedy",
    "parse_sampler_chars",
    "parse_sampler_names",
    "parse_sampler_order",
    "sample_batch",
]
