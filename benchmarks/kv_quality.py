"""KV cache types compared on a real model: bytes per token, attention error, perplexity.

For each cache type (keys and values stored alike, or `KEYS/VALUES` such as `q8_0/turbo4`)
it reports:
- the KV bytes one token takes over all layers, and that over float16's;
- the relative error of every layer's attention output when its real keys and values
  (captured from the model on the text's first `--attention-tokens` tokens, float32 on
  the CPU) are stored as the type in a paged cache, as one row written at once, against
  storing them as float16:
  sqrt(sum ||O - O_f16||^2 / sum ||O_f16||^2) over layers, heads and positions, with the
  same real queries;
- the perplexity of the model on a fixed English text run through the paged KV cache of
  that type in prefill chunks, so that every later chunk attends to stored (encoded and
  decoded) keys and values, and its change against float16, with the standard error of
  that change over the text's tokens (how far the change could move on other text of the
  same length: a difference between types smaller than it is not resolved).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        uv run python benchmarks/kv_quality.py
    uv run python benchmarks/kv_quality.py -m model.gguf --types f16 q8_0 --chunk 128
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx_lm.models.llama as mlx_lm_llama

from mlxcel_core.cache.paged import (
    BatchRow,
    LayerGeometry,
    PagedBatch,
    PagedKVStorage,
    make_layer_caches,
    residual_blocks_per_row,
)
from mlxcel_core.cache.quant import CACHE_TYPES
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.language_model import LanguageModel
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loading.loader import load_model

TEXT = Path(__file__).resolve().parent / "data" / "pride_and_prejudice_ch2_3.txt"
REFERENCE = "f16"
BLOCK_SIZE = 16


@dataclass(frozen=True)
class LayerActivations:
    """One attention layer's real inputs: (1, H_q, T, D) queries, (1, H_kv, T, D) keys and
    values after RoPE, and the layer's softmax scale."""

    queries: mx.array
    keys: mx.array
    values: mx.array
    scale: float


@contextmanager
def recording_attention(layers: list[LayerActivations]) -> Iterator[None]:
    """Record every call of mlx-lm's llama attention while the block runs.

    The queries never pass through the cache protocol, so the attention function itself
    is wrapped; it must be mlx-lm's llama family (SmolLM2 is).
    """
    original = mlx_lm_llama.scaled_dot_product_attention

    def recording(queries, keys, values, cache, scale, mask, **kwargs):
        layers.append(LayerActivations(queries, keys, values, scale))
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, **kwargs)

    mlx_lm_llama.scaled_dot_product_attention = recording
    try:
        yield
    finally:
        mlx_lm_llama.scaled_dot_product_attention = original


def capture_activations(model: LanguageModel, token_ids: Sequence[int]) -> list[LayerActivations]:
    """Each layer's queries, keys and values over the whole text, from one forward pass."""
    layers: list[LayerActivations] = []
    with recording_attention(layers):
        mx.eval(model(mx.array([token_ids]), model.make_cache(), last_only=True))
    mx.eval([(a.queries, a.keys, a.values) for a in layers])
    return layers


def stored(cache_type: str, x: mx.array) -> mx.array:
    """(1, H, T, D) keys or values as a paged cache of `cache_type` gives them back, the T
    positions written as one row."""
    _, H, T, D = x.shape
    storage, batch = _one_row_storage(cache_type, H, T, D, x.dtype)
    rows = x[0].transpose(1, 0, 2)
    storage.write(0, batch.write_slots, rows, rows, batch.anchors)
    return storage.gather(0, batch.read_slots, batch.anchors)[0]


@functools.lru_cache(maxsize=4)
def _one_row_storage(
    cache_type: str, heads: int, length: int, dim: int, dtype: mx.Dtype
) -> tuple[PagedKVStorage, PagedBatch]:
    """A one-layer paged storage of `cache_type` and one row of `length` positions over
    it; kept, as making a storage makes (and compiles) its codecs, and every write of the
    row overwrites all of it."""
    num_blocks = math.ceil(length / BLOCK_SIZE) + 1
    geometry = LayerGeometry(num_kv_heads=heads, key_dim=dim, value_dim=dim, dtype=dtype)
    storage = PagedKVStorage([geometry], BLOCK_SIZE, num_blocks, cache_type_k=cache_type)
    storage.ensure_capacity(num_blocks)
    return storage, PagedBatch([BatchRow(list(range(1, num_blocks)), 0, length)], BLOCK_SIZE)


def split_types(cache_type: str) -> tuple[str, str]:
    """The key and value types of `TYPE` or `KEYS/VALUES`.

    Raises:
        ValueError: a part is not one of `CACHE_TYPES`.
    """
    key_type, _, value_type = cache_type.partition("/")
    value_type = value_type or key_type
    for part in (key_type, value_type):
        if part not in CACHE_TYPES:
            raise ValueError(f"cache types are {', '.join(CACHE_TYPES)}; got {part!r}")
    return key_type, value_type


def attention_error(layers: Sequence[LayerActivations], cache_type: str) -> float:
    """Relative error of causal attention outputs with `cache_type` against float16 storage."""
    squared_error = squared_norm = 0.0
    for layer in layers:

        def attend(kind: str, layer: LayerActivations = layer) -> mx.array:
            key_type, value_type = split_types(kind)
            keys, values = stored(key_type, layer.keys), stored(value_type, layer.values)
            return mx.fast.scaled_dot_product_attention(
                layer.queries, keys, values, scale=layer.scale, mask="causal"
            )

        reference, output = attend(REFERENCE), attend(cache_type)
        squared_error += mx.sum((output - reference) ** 2).item()
        squared_norm += mx.sum(reference**2).item()
    return math.sqrt(squared_error / squared_norm)


def token_nlls(
    model: LanguageModel,
    token_ids: Sequence[int],
    cache_type: str,
    chunk_size: int,
    residual: int = 0,
) -> mx.array:
    """(T - 1,) float32 negative log-likelihoods of tokens 2..T, prefilled in `chunk_size`
    chunks through a paged KV cache storing keys and values as `cache_type`, keeping the
    last `residual` positions exact (`PagedKVStorage`'s residual window); their mean's
    exponential is the perplexity.

    Raises:
        ValueError: fewer than 2 tokens, or `chunk_size` < 1.
    """
    if len(token_ids) < 2:
        raise ValueError(f"token_ids must hold at least 2 tokens, got {len(token_ids)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    profile = profile_model(model, 1)
    num_blocks = math.ceil(len(token_ids) / BLOCK_SIZE) + 1
    key_type, value_type = split_types(cache_type)
    storage = PagedKVStorage(
        profile.layers,
        BLOCK_SIZE,
        num_blocks,
        cache_type_k=key_type,
        cache_type_v=value_type,
        residual_window=residual,
        num_residual_blocks=residual_blocks_per_row(residual, BLOCK_SIZE),
    )
    storage.ensure_capacity(num_blocks)
    block_table = list(range(1, num_blocks))
    tokens = mx.array(token_ids)
    chunks = []
    for start in range(0, len(token_ids) - 1, chunk_size):
        end = min(start + chunk_size, len(token_ids) - 1)
        batch = PagedBatch([BatchRow(block_table, start, end - start)], BLOCK_SIZE)
        logits = model(tokens[None, start:end], make_layer_caches(storage, batch))
        logprobs = logits[0].astype(mx.float32) - mx.logsumexp(
            logits[0].astype(mx.float32), axis=-1, keepdims=True
        )
        targets = tokens[start + 1 : end + 1]
        nlls = -mx.take_along_axis(logprobs, targets[:, None], axis=-1)[:, 0]
        mx.eval(nlls, storage.arrays())
        chunks.append(nlls)
    return mx.concatenate(chunks)


def perplexity_change(nlls: mx.array, reference_nlls: mx.array) -> tuple[float, float]:
    """The relative change of perplexity against the reference's, and its standard error,
    both as fractions.

    The change is exp(mean(d)) - 1 with d the per-token differences of negative
    log-likelihood; its standard error is std(d) / sqrt(T) carried through the exponential
    (to first order, exp(mean(d)) times the standard error of mean(d)).
    """
    differences = (nlls - reference_nlls).astype(mx.float32)
    mean = mx.mean(differences).item()
    spread = mx.std(differences, ddof=1).item() if differences.size > 1 else 0.0
    return math.expm1(mean), math.exp(mean) * spread / math.sqrt(differences.size)


def kv_bytes_per_token(
    model: LanguageModel, cache_type: str, residual: int = 0, num_tokens: int = 1
) -> float:
    """Key and value bytes one token takes over all layers, stored as `cache_type`, with
    the exact copies of a `residual`-position window spread over a `num_tokens` sequence:
    every block the window can touch (`residual_blocks_per_row`), as the cache keeps
    whole blocks."""
    layers = profile_model(model, 1).layers
    types = split_types(cache_type)
    stored = sum(layer.bytes_per_token(*types) for layer in layers)
    exact = sum(layer.exact_bytes_per_token(*types) for layer in layers)
    exact_positions = residual_blocks_per_row(residual, BLOCK_SIZE) * BLOCK_SIZE
    return stored + exact * exact_positions / num_tokens


def report(
    model: LanguageModel,
    token_ids: Sequence[int],
    cache_types: Sequence[str],
    chunk_size: int,
    attention_tokens: int,
    residual: int = 0,
) -> Iterator[str]:
    """The table's lines, as each is measured: a header, then one row per cache type
    (every type but the f16 reference with a `residual`-position window)."""
    layers = capture_activations(model, token_ids[:attention_tokens])
    reference_bytes = kv_bytes_per_token(model, REFERENCE)
    reference_nlls = token_nlls(model, token_ids, REFERENCE, chunk_size)
    yield (
        "| cache type | KV bytes/token | vs f16 | attention rel. error vs f16 "
        "| perplexity | vs f16 | std. error |"
    )
    yield "|---|---:|---:|---:|---:|---:|---:|"
    for cache_type in cache_types:
        window = 0 if cache_type == REFERENCE else residual
        size = kv_bytes_per_token(model, cache_type, window, len(token_ids))
        nlls = (
            reference_nlls
            if cache_type == REFERENCE
            else token_nlls(model, token_ids, cache_type, chunk_size, window)
        )
        change, error = perplexity_change(nlls, reference_nlls)
        yield (
            f"| {cache_type} | {size:.0f} | {size / reference_bytes:.3f}x "
            f"| {attention_error(layers, cache_type):.2e} | {math.exp(mx.mean(nlls).item()):.4f} "
            f"| {100 * change:+.3f}% | {100 * error:.3f}% |"
        )


def add_model_and_text_flags(parser: argparse.ArgumentParser) -> None:
    """`-m/--model` and `--text`, which `model_and_text_tokens` reads."""
    parser.add_argument("-m", "--model", default=None, help="GGUF file or folder")
    parser.add_argument("--text", default=str(TEXT), help="UTF-8 text file")


def check_type_names(parser: argparse.ArgumentParser, cache_types: Sequence[str]) -> None:
    """Exit through `parser.error` on a name `split_types` refuses."""
    for cache_type in cache_types:
        try:
            split_types(cache_type)
        except ValueError as error:
            parser.error(str(error))


def model_and_text_tokens(args: argparse.Namespace) -> tuple[LanguageModel, list[int]]:
    """The model `--model` names (the embedded one by default) and the token ids of
    `--text`."""
    loaded = load_model(args.model or default_model_path())
    return loaded.model, loaded.tokenizer.encode(Path(args.text).read_text(encoding="utf-8"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_and_text_flags(parser)
    parser.add_argument("--chunk", type=int, default=256, help="prefill chunk (tokens)")
    parser.add_argument(
        "--residual",
        type=int,
        default=0,
        help="positions kept exact at the end of the sequence (a residual window); the "
        "bytes of the blocks it can touch are spread over the text's tokens",
    )
    parser.add_argument(
        "--attention-tokens", type=int, default=512, help="tokens whose attention is compared"
    )
    # "auto" is the model's dtype: float32 on the CPU, the f32 row.
    types = [t for t in CACHE_TYPES if t != "auto"]
    parser.add_argument(
        "--types", nargs="+", default=types, help="cache types, TYPE or KEYS/VALUES"
    )
    args = parser.parse_args(argv)
    check_type_names(parser, args.types)
    if args.residual < 0:
        parser.error(f"--residual must be >= 0, got {args.residual}")
    model, token_ids = model_and_text_tokens(args)
    print(
        f"{len(token_ids)} tokens, prefill chunks of {args.chunk}, residual window of "
        f"{args.residual}, attention compared on the first "
        f"{min(args.attention_tokens, len(token_ids))} (stored without a window)",
        flush=True,
    )
    lines = report(model, token_ids, args.types, args.chunk, args.attention_tokens, args.residual)
    for line in lines:
        print(line, flush=True)


if __name__ == "__main__":
    main()
