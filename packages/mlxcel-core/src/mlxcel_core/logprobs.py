"""Log probabilities of sampled tokens: the model's log-softmax over the raw logits.

Computed before the sampler chain (penalties, top-k, temperature...), as OpenAI and vLLM
report them, so they describe the model and not the sampling settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class TokenLogprobs:
    """The log probability of one sampled token and of the most likely alternatives.

    Attributes:
        token_id: the sampled token.
        logprob: its natural-log probability under the raw logits (<= 0).
        top_ids: the most likely token ids, most likely first.
        top_logprobs: their log probabilities, descending, as long as `top_ids`.

    Raises:
        ValueError: `top_ids` and `top_logprobs` differ in length.
    """

    token_id: int
    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.top_ids) != len(self.top_logprobs):
            raise ValueError(
                f"top_ids and top_logprobs must have one length, got {len(self.top_ids)} "
                f"and {len(self.top_logprobs)}"
            )


@dataclass(frozen=True)
class PendingLogprobs:
    """Lazy arrays for one step's `TokenLogprobs`, queued with the step's token.

    Attributes:
        chosen: () float32, the sampled token's log probability.
        top_ids: (k,) uint32 token ids, most likely first.
        top_logprobs: (k,) float32 log probabilities, descending.
    """

    chosen: mx.array
    top_ids: mx.array
    top_logprobs: mx.array

    def arrays(self) -> tuple[mx.array, mx.array, mx.array]:
        """The arrays to evaluate along with the step's token."""
        return self.chosen, self.top_ids, self.top_logprobs

    def read(self, token_id: int) -> TokenLogprobs:
        """Read the evaluated arrays back as a `TokenLogprobs` for `token_id`."""
        return TokenLogprobs(
            token_id=token_id,
            logprob=float(self.chosen.item()),
            top_ids=tuple(self.top_ids.tolist()),
            top_logprobs=tuple(self.top_logprobs.tolist()),
        )


def make_logprobs(logits: mx.array, token: mx.array, num_top: int) -> PendingLogprobs:
    """Build (lazily) the log probabilities of `token` and of the `num_top` likeliest tokens.

    Args:
        logits: (V,) raw logits of one position, any float dtype.
        token: () int32, the token sampled from them.
        num_top: how many alternatives to report; clipped to V.

    Returns:
        The unevaluated arrays; evaluate them with `mx.async_eval` and `read` them back.

    Raises:
        ValueError: `num_top` is negative.
    """
    if num_top < 0:
        raise ValueError(f"num_top must be >= 0, got {num_top}")
    logits = logits.astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits)
    chosen = mx.take(logprobs, token)
    k = min(num_top, logprobs.shape[0])
    if k == 0:
        return PendingLogprobs(chosen, mx.zeros((0,), mx.uint32), mx.zeros((0,), mx.float32))
    top_ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
    top_values = mx.take(logprobs, top_ids)
    order = mx.argsort(-top_values)
    return PendingLogprobs(chosen, mx.take(top_ids, order), mx.take(top_values, order))
