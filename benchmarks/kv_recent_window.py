"""What keeping each sequence's most recent positions exact would gain a KV cache type.

A simulation, to choose a window: the model reads the text in one forward pass in
which every query sees the keys and values of its own last `W` positions (itself
included) exactly, and every earlier position as a paged cache of the type stores it
(`kv_quality.stored`: the whole text written as one row, so TurboQuant keys are centered
on the first block as in the real cache). This is the view a decode step would have if the
cache kept a sliding window of W positions per sequence in the model's dtype on top of the
type's blocks (KIVI's full-precision residual: Liu et al., "KIVI: A Tuning-Free Asymmetric
2bit Quantization for KV Cache", 2024). Window 0 is the type alone. The paged cache's own
window (`--cache-residual`, whole blocks) is measured by `kv_quality.py --residual`.

For each type and window it reports the KV bytes per token over the text (the window's
positions at float16's bytes, the rest at the type's), and the perplexity change against
exact keys and values, with its standard error over the text's tokens (as
`kv_quality.perplexity_change`).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        uv run python benchmarks/kv_recent_window.py --types turbo4 turbo3 --windows 0 16 32
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import mlx.core as mx
import mlx_lm.models.llama as mlx_lm_llama
from kv_quality import (
    REFERENCE,
    add_model_and_text_flags,
    check_type_names,
    kv_bytes_per_token,
    model_and_text_tokens,
    perplexity_change,
    split_types,
    stored,
)

from mlxcel_core.language_model import LanguageModel

EXACT = "exact"


def windowed_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    cache_type: str,
    window: int,
) -> mx.array:
    """Causal attention of (1, H_q, T, D) queries over (1, H_kv, T, D) keys and values:
    position s is read exactly by the query at t when t - s < `window`, else as
    `cache_type` stores it. Returns (1, H_q, T, D_v) in the queries' dtype."""
    key_type, value_type = split_types(cache_type)
    stored_keys, stored_values = stored(key_type, keys), stored(value_type, values)
    dtype, repeats = queries.dtype, queries.shape[1] // keys.shape[1]
    keys, values, stored_keys, stored_values = (
        mx.repeat(x.astype(mx.float32), repeats, axis=1)
        for x in (keys, values, stored_keys, stored_values)
    )
    queries = queries.astype(mx.float32)
    length = keys.shape[2]
    distance = mx.arange(length)[:, None] - mx.arange(length)[None, :]
    exact = distance < window
    scores = mx.where(
        exact,
        queries @ keys.transpose(0, 1, 3, 2),
        queries @ stored_keys.transpose(0, 1, 3, 2),
    )
    weights = mx.softmax(mx.where(distance >= 0, scores * scale, -mx.inf), axis=-1)
    exact_weights = mx.where(exact, weights, 0.0)
    output = exact_weights @ values + (weights - exact_weights) @ stored_values
    return output.astype(dtype)


@contextmanager
def attention_reading(cache_type: str, window: int) -> Iterator[None]:
    """Route mlx-lm's llama attention through `windowed_attention` while the block runs;
    cache type `EXACT` leaves it as it is."""
    original = mlx_lm_llama.scaled_dot_product_attention

    def attend(queries, keys, values, cache, scale, mask, **kwargs):
        return windowed_attention(queries, keys, values, scale, cache_type, window)

    if cache_type != EXACT:
        mlx_lm_llama.scaled_dot_product_attention = attend
    try:
        yield
    finally:
        mlx_lm_llama.scaled_dot_product_attention = original


def token_nlls(
    model: LanguageModel, token_ids: Sequence[int], cache_type: str, window: int
) -> mx.array:
    """(T - 1,) float32 negative log-likelihoods of tokens 2..T in one forward pass that
    reads keys and values as `windowed_attention` does (`EXACT`: as the model made them).

    Raises:
        ValueError: fewer than 2 tokens.
    """
    if len(token_ids) < 2:
        raise ValueError(f"token_ids must hold at least 2 tokens, got {len(token_ids)}")
    with attention_reading(cache_type, window):
        logits = model(mx.array([token_ids[:-1]]), model.make_cache())[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    targets = mx.array(token_ids[1:])[:, None]
    nlls = -mx.take_along_axis(logprobs, targets, axis=-1)[:, 0]
    mx.eval(nlls)
    return nlls


def bytes_per_token(model: LanguageModel, cache_type: str, window: int, length: int) -> float:
    """KV bytes per token over `length` positions, the last `window` of them at float16's
    bytes and the rest at `cache_type`'s."""
    exact = min(window, length)
    return (
        exact * kv_bytes_per_token(model, REFERENCE)
        + (length - exact) * kv_bytes_per_token(model, cache_type)
    ) / length


def report(
    model: LanguageModel,
    token_ids: Sequence[int],
    cache_types: Sequence[str],
    windows: Sequence[int],
) -> Iterator[str]:
    """The table's lines, as each is measured: a header, then a row per type and window."""
    reference_nlls = token_nlls(model, token_ids, EXACT, 0)
    reference_bytes = kv_bytes_per_token(model, REFERENCE)
    yield "| cache type | window | KV bytes/token | vs f16 | perplexity | vs exact | std. error |"
    yield "|---|---:|---:|---:|---:|---:|---:|"
    for cache_type in cache_types:
        for window in windows:
            size = bytes_per_token(model, cache_type, window, len(token_ids))
            nlls = token_nlls(model, token_ids, cache_type, window)
            change, error = perplexity_change(nlls, reference_nlls)
            yield (
                f"| {cache_type} | {window} | {size:.0f} | {size / reference_bytes:.3f}x "
                f"| {math.exp(mx.mean(nlls).item()):.4f} | {100 * change:+.3f}% "
                f"| {100 * error:.3f}% |"
            )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_and_text_flags(parser)
    parser.add_argument(
        "--types", nargs="+", default=["turbo4", "turbo3"], help="TYPE or KEYS/VALUES"
    )
    parser.add_argument(
        "--windows", nargs="+", type=int, default=[0, 16, 32], help="exact positions"
    )
    args = parser.parse_args(argv)
    check_type_names(parser, args.types)
    if any(window < 0 for window in args.windows):
        parser.error(f"windows must be >= 0, got {args.windows}")
    model, token_ids = model_and_text_tokens(args)
    print(f"{len(token_ids)} tokens, read in one forward pass", flush=True)
    for line in report(model, token_ids, args.types, args.windows):
        print(line, flush=True)


if __name__ == "__main__":
    main()
