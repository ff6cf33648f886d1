"""The per-request sampler: logit bias, llama-server's chain of stages, then one draw;
and the batched draw of many requests whose chains need no per-row work."""

import dataclasses
import secrets
from collections.abc import Hashable, Sequence

import mlx.core as mx

from mlxcel_core.kernels.gumbel_sampling import gumbel_max_sample_kernel
from mlxcel_core.kernels.options import kernel_backend
from mlxcel_core.sampling.params import SamplerStage, SamplingParams
from mlxcel_core.sampling.penalties import apply_dry, apply_logit_bias, apply_penalties
from mlxcel_core.sampling.stages import (
    apply_min_p,
    apply_temperature,
    apply_top_k,
    apply_top_n_sigma,
    apply_top_p,
    apply_typical_p,
    apply_xtc,
)

_ARGMAX_PRESERVING_STAGES = frozenset(
    {
        SamplerStage.TOP_N_SIGMA,
        SamplerStage.TOP_K,
        SamplerStage.TOP_P,
        SamplerStage.MIN_P,
        SamplerStage.TEMPERATURE,
    }
)


# Stages that read the history or draw per row; the batched draw needs them inactive.
_ROW_STAGES = frozenset({SamplerStage.PENALTIES, SamplerStage.DRY, SamplerStage.XTC})

_GREEDY_GROUP = "greedy"


def _is_active(stage: SamplerStage, params: SamplingParams) -> bool:
    """Whether the stage can change any logits under these settings (see each stage's
    disabling values in `stages.py` and `penalties.py`)."""
    p = params
    match stage:
        case SamplerStage.PENALTIES:
            return p.repeat_last_n != 0 and (
                p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
            )
        case SamplerStage.DRY:
            return p.dry_multiplier != 0.0 and p.dry_base >= 1.0 and p.dry_penalty_last_n != 0
        case SamplerStage.TOP_N_SIGMA:
            return p.top_n_sigma > 0.0
        case SamplerStage.TOP_K:
            return p.top_k > 0
        case SamplerStage.TYPICAL_P:
            return p.typical_p < 1.0
        case SamplerStage.TOP_P:
            return p.top_p < 1.0
        case SamplerStage.MIN_P:
            return p.min_p > 0.0
        case SamplerStage.XTC:
            return p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5
        case SamplerStage.TEMPERATURE:
            return True


def _batch_group(params: SamplingParams, active: tuple[SamplerStage, ...]) -> Hashable | None:
    """Requests of one group draw together (see `sample_batch`); None draws alone."""
    if params.logit_bias or any(stage in _ROW_STAGES for stage in active):
        return None
    if params.greedy:
        return None if SamplerStage.TYPICAL_P in active else _GREEDY_GROUP
    return dataclasses.replace(params, seed=0)


def _split_final_temperature(
    stages: tuple[SamplerStage, ...], temperature: float
) -> tuple[tuple[SamplerStage, ...], float]:
    """The stages the chain runs before the fused Gumbel-max draw, and the temperature that
    draw divides by: a chain of active stages ending in the temperature stage hands its
    division (T > 0) to the kernel; any other chain runs whole, its temperature (if any)
    already applied, and the draw takes T = 1."""
    if stages and stages[-1] is SamplerStage.TEMPERATURE:
        return stages[:-1], temperature
    return stages, 1.0


def _as_vector(logits: mx.array) -> mx.array:
    if logits.ndim == 2 and logits.shape[0] == 1:
        logits = logits[0]
    if logits.ndim != 1:
        raise ValueError(f"logits must have shape (V,) or (1, V), got {tuple(logits.shape)}")
    return logits.astype(mx.float32)


class Sampler:
    """Samples one request's next token the way llama-server's sampler chain does.

    Logit bias is applied first, then the stages in `params.samplers` order, then a
    categorical draw over the surviving logits (argmax when `params.greedy`).
    Temperature scales the logits only where the order puts it (last by default, so top-k,
    top-p and min-p see the untempered distribution). An order without the temperature stage
    draws at temperature 1, as llama.cpp does, except that temperature <= 0 stays greedy.
    Source: llama.cpp `common/sampling.cpp` (`common_sampler_init`, `common_sampler_sample`).

    Each sampler owns its random stream: `mx.random.key(seed)`, split twice per token (XTC's
    draw and the final draw, used or not), so a seeded request draws the same tokens whatever
    else runs beside it. `sample_batch` advances a sampled row's stream the same way; greedy
    rows never draw from theirs.

    On a GPU whose kernels run (`mlxcel_core.kernels.options.kernel_backend`) the final
    draw is the fused Gumbel-max kernel (`mlxcel_core.kernels.gumbel_sampling`) keyed by
    the same split of the stream, and a chain that ends in the temperature stage leaves
    its division to that kernel; elsewhere it is `mx.random.categorical`. Both draw from
    the same distribution, but not the same tokens: a seed reproduces its tokens on one
    kind of device.

    Attributes:
        params: The request's settings.
        seed: The stream's seed: `params.seed`, or a random 32-bit one when that is None
            (llama-server reports it back as `seed`).
        batch_group: Requests with equal groups can draw together through `sample_batch`
            (greedy ones, or sampled ones with the same settings and no logit bias, penalties,
            DRY or XTC); None when this request's chain must run alone.
        reads_history_on_host: Its chain reads the token history as host ints (an active
            DRY stage), so every token before the one it samples must be known on the host.
    """

    def __init__(
        self, params: SamplingParams, *, dry_breaker_ids: frozenset[int] = frozenset()
    ) -> None:
        """Build a sampler.

        Args:
            params: The request's settings.
            dry_breaker_ids: Token ids that end a DRY repetition; the caller maps
                `params.dry_sequence_breakers` to ids with its tokenizer.
        """
        self.params = params
        self.seed = secrets.randbits(32) if params.seed is None else int(params.seed)
        self._dry_breaker_ids = dry_breaker_ids
        self._key = mx.random.key(self.seed)
        # After a batched draw the stream's state is row `row` of that draw's (rows, 2) keys;
        # the next batch of the same rows reads them whole, with no per-row op.
        self._batch_keys: tuple[mx.array, int] | None = None
        # Greedy decoding skips the stages that always keep the most likely token.
        self._greedy_stages = tuple(
            stage for stage in params.samplers if stage not in _ARGMAX_PRESERVING_STAGES
        )
        self._active_stages = tuple(stage for stage in params.samplers if _is_active(stage, params))
        self.batch_group = _batch_group(params, self._active_stages)
        self.reads_history_on_host = SamplerStage.DRY in self._active_stages

    def next_key(self) -> mx.array:
        """Split a key off the request's random stream (for draws made outside the chain,
        such as speculative decoding's acceptance tests)."""
        self._key, key = mx.random.split(self._state())
        return key

    def _state(self) -> mx.array:
        """(2,) uint32: the stream's current key."""
        if self._batch_keys is not None:
            keys, row = self._batch_keys
            self._key, self._batch_keys = keys[row], None
        return self._key

    def _apply_stage(
        self, stage: SamplerStage, logits: mx.array, history: mx.array, xtc_draw: mx.array
    ) -> mx.array:
        p = self.params
        match stage:
            case SamplerStage.PENALTIES:
                return apply_penalties(
                    logits,
                    history,
                    repeat_penalty=p.repeat_penalty,
                    repeat_last_n=p.repeat_last_n,
                    presence_penalty=p.presence_penalty,
                    frequency_penalty=p.frequency_penalty,
                )
            case SamplerStage.DRY:
                return apply_dry(
                    logits,
                    history,
                    multiplier=p.dry_multiplier,
                    base=p.dry_base,
                    allowed_length=p.dry_allowed_length,
                    penalty_last_n=p.dry_penalty_last_n,
                    breaker_ids=self._dry_breaker_ids,
                )
            case SamplerStage.TOP_N_SIGMA:
                return apply_top_n_sigma(logits, p.top_n_sigma)
            case SamplerStage.TOP_K:
                return apply_top_k(logits, p.top_k)
            case SamplerStage.TYPICAL_P:
                return apply_typical_p(logits, p.typical_p)
            case SamplerStage.TOP_P:
                return apply_top_p(logits, p.top_p)
            case SamplerStage.MIN_P:
                return apply_min_p(logits, p.min_p)
            case SamplerStage.XTC:
                return apply_xtc(logits, p.xtc_probability, p.xtc_threshold, xtc_draw)
            case SamplerStage.TEMPERATURE:
                return apply_temperature(logits, p.temperature)

    def apply_chain(self, logits: mx.array, history: mx.array) -> mx.array:
        """Apply logit bias and the stages; the result's softmax is the distribution drawn from.

        Advances the random stream by one key (XTC's draw), used or not, so that the stream
        does not depend on the settings.

        Args:
            logits: (V,) or (1, V) float logits of the next token.
            history: (T,) int32 token ids so far, prompt and generated; may be lazy (only an
                active DRY stage evaluates it).

        Returns:
            (V,) float32 logits; removed tokens are -inf.

        Raises:
            ValueError: `logits` has another shape, or a logit-bias token id is >= V.
        """
        return self._run_stages(logits, history, self.params.samplers)

    def _run_stages(
        self, logits: mx.array, history: mx.array, stages: tuple[SamplerStage, ...]
    ) -> mx.array:
        xtc_draw = mx.random.uniform(key=self.next_key())
        logits = apply_logit_bias(_as_vector(logits), self.params.logit_bias)
        for stage in stages:
            logits = self._apply_stage(stage, logits, history, xtc_draw)
        return logits

    def __call__(self, logits: mx.array, history: mx.array) -> mx.array:
        """Sample the next token.

        Args:
            logits: (V,) or (1, V) float logits of the next token.
            history: (T,) int32 token ids so far, prompt and generated; may be lazy.

        Returns:
            () int32 token id, left unevaluated so the caller can `mx.async_eval` it.

        Raises:
            ValueError: As `apply_chain`.
        """
        if self.params.greedy:
            processed = self._run_stages(logits, history, self._greedy_stages)
            self.next_key()
            return mx.argmax(processed).astype(mx.int32)
        backend = kernel_backend(mx.default_device())
        if backend is not None:
            stages, temperature = _split_final_temperature(
                self._active_stages, self.params.temperature
            )
            processed = self._run_stages(logits, history, stages)
            temperatures = mx.array([temperature], dtype=mx.float32)
            keys = self.next_key()[None]
            tokens = gumbel_max_sample_kernel(processed[None], temperatures, keys, backend=backend)
            return tokens[0]
        processed = self.apply_chain(logits, history)
        return mx.random.categorical(processed, key=self.next_key()).astype(mx.int32)


def _advance_twice(key: mx.array) -> mx.array:
    """(2, 2): a stream's state after one token's two splits, and the second split's key
    (the one `Sampler.__call__` draws the token with; the first is XTC's, unused here)."""
    return mx.random.split(mx.random.split(key)[0])


def _categorical(logits: mx.array, key: mx.array) -> mx.array:
    return mx.random.categorical(logits, key=key)


_advance_rows = mx.vmap(_advance_twice)
_categorical_rows = mx.vmap(_categorical)


def _stream_states(samplers: Sequence[Sampler]) -> mx.array:
    """(rows, 2) uint32 current keys: the previous batched draw's keys when it held exactly
    these rows in this order, else one stack of each stream's key."""
    previous = samplers[0]._batch_keys
    if previous is not None and previous[0].shape[0] == len(samplers):
        keys = previous[0]
        if all(
            sampler._batch_keys is not None
            and sampler._batch_keys[0] is keys
            and sampler._batch_keys[1] == row
            for row, sampler in enumerate(samplers)
        ):
            return keys
    return mx.stack([sampler._state() for sampler in samplers])


def sample_batch(samplers: Sequence[Sampler], logits: mx.array) -> mx.array:
    """Draw one token per row with each row's sampler, in a fixed number of MLX ops.

    Every row gets the token its sampler's `__call__` would give it for these logits:
    greedy rows take the argmax; sampled rows run the shared stages over the whole batch and
    draw with their own stream's key, split from all rows' keys at once (`mx.vmap`), so a
    seeded request draws the same tokens alone or batched. Greedy samplers never use their
    stream, which is left where it is.

    Args:
        samplers: one per row, all with the same non-None `batch_group`.
        logits: (rows, V) float logits of each row's next token.

    Returns:
        (rows,) int32 token ids, unevaluated.

    Raises:
        ValueError: the samplers are of different or no batch groups, or `logits` has
            another number of rows.
    """
    groups = {sampler.batch_group for sampler in samplers}
    if len(groups) != 1 or None in groups:
        raise ValueError(f"samplers must share one batch group, got {len(groups)} groups")
    if logits.ndim != 2 or logits.shape[0] != len(samplers):
        raise ValueError(f"logits must have shape ({len(samplers)}, V), got {tuple(logits.shape)}")
    logits = logits.astype(mx.float32)
    if groups == {_GREEDY_GROUP}:
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    first = samplers[0]
    backend = kernel_backend(mx.default_device())
    stages, temperature = first._active_stages, 1.0
    if backend is not None:
        stages, temperature = _split_final_temperature(stages, first.params.temperature)
    for stage in stages:
        logits = first._apply_stage(stage, logits, mx.array([], dtype=mx.int32), 0.0)
    advanced = _advance_rows(_stream_states(samplers))
    states = advanced[:, 0]
    for row, sampler in enumerate(samplers):
        sampler._batch_keys = (states, row)
    if backend is not None:
        temperatures = mx.full((len(samplers),), temperature, dtype=mx.float32)
        return gumbel_max_sample_kernel(logits, temperatures, advanced[:, 1], backend=backend)
    return _categorical_rows(logits, advanced[:, 1]).astype(mx.int32)
