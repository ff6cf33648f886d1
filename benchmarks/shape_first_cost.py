"""What the first call at a new sequence length costs, against a length already seen.

MLX's CUDA backend keeps per-shape state (cuDNN attention plans, cuBLASLt algorithm
choices), so the first call at a shape can cost far more than the next. Two probes, each
timing every call alone (synchronized before and after), first at twelve (or eight) lengths
never met before ("new"), then at the same lengths again ("seen"):

- `ops`: one operation of a Llama-3.2-1B-shaped layer at a time (bf16, hidden 2048, 32
  query and 8 KV heads of 64, MLP 8192) over (1, L, 2048) inputs, L = 300..307: the QKV-sized
  and MLP-sized products, RMS norm, RoPE, SiLU times the input, and causal attention over
  L keys and over 512 + L keys (their random keys drawn inside the timed call, a
  small kernel beside the attention);
- `model`: the whole forward pass of an mlx-lm folder's model over L = 400..411 tokens
  on caches that store nothing (`mlxcel_core.engine.memory.measure_pass`, the LM head on the last
  position only), then the best of three passes at 512-8,192 tokens.

Run the `model` probe under `MLX_CUDA_USE_CUDNN_SDPA=0` too, to compare MLX's attention
without cuDNN (its unfused fallback on CUDA).

    python3 benchmarks/random_model.py llama-3.2-1b /tmp/l1b
    python3 benchmarks/shape_first_cost.py ops
    python3 benchmarks/shape_first_cost.py model /tmp/l1b
    MLX_CUDA_USE_CUDNN_SDPA=0 python3 benchmarks/shape_first_cost.py model /tmp/l1b
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from random_model import SHAPES

_LAYER = SHAPES["llama-3.2-1b"]
HIDDEN, QUERY_HEADS, KV_HEADS, HEAD_DIM, MLP = (
    _LAYER[name]
    for name in (
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
    )
)


def timed_ms(run: Callable[[], object]) -> float:
    """Milliseconds `run` takes, which must evaluate what it computes."""
    mx.synchronize()
    start = time.perf_counter()
    run()
    mx.synchronize()
    return (time.perf_counter() - start) * 1e3


def _row(values: list[float], digits: int) -> str:
    return " ".join(f"{value:.{digits}f}" for value in values)


def probe_ops() -> None:
    weight = mx.random.normal((HIDDEN, HIDDEN)).astype(mx.bfloat16)
    mlp_weight = mx.random.normal((MLP, HIDDEN)).astype(mx.bfloat16)
    norm_weight = mx.ones((HIDDEN,), dtype=mx.bfloat16)
    rope = nn.RoPE(HEAD_DIM, base=500000.0)
    mx.eval(weight, mlp_weight, norm_weight)

    def attention(x: mx.array, offset: int) -> mx.array:
        length = x.shape[1]
        queries = x.reshape(1, length, QUERY_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        keys = mx.random.normal((1, KV_HEADS, offset + length, HEAD_DIM)).astype(mx.bfloat16)
        return mx.fast.scaled_dot_product_attention(
            queries, keys, keys, scale=HEAD_DIM**-0.5, mask="causal"
        )

    ops: dict[str, Callable[[mx.array], mx.array]] = {
        "matmul 2048x2048": lambda x: x @ weight.T,
        "matmul 2048x8192": lambda x: x @ mlp_weight.T,
        "rms_norm": lambda x: mx.fast.rms_norm(x, norm_weight, 1e-5),
        "rope": lambda x: rope(
            x.reshape(1, -1, QUERY_HEADS, HEAD_DIM).transpose(0, 2, 1, 3), offset=0
        ),
        "silu(x) * x": lambda x: nn.silu(x) * x,
        "attention, L keys": lambda x: attention(x, 0),
        "attention, 512 + L keys": lambda x: attention(x, 512),
    }

    def at_length(op: Callable[[mx.array], mx.array], length: int) -> float:
        x = mx.random.normal((1, length, HIDDEN)).astype(mx.bfloat16)
        mx.eval(x)
        return timed_ms(lambda: mx.eval(op(x)))

    for name, op in ops.items():
        at_length(op, 64)
        new = [at_length(op, length) for length in range(300, 308)]
        seen = [at_length(op, length) for length in range(300, 308)]
        print(f"{name:24s} new {_row(new, 1)} | seen {_row(seen, 2)} ms", flush=True)


def probe_model(folder: str) -> None:
    from mlxcel_core.engine.memory import measure_pass
    from mlxcel_models.loading.loader import load_model

    model = load_model(folder).model
    cudnn = os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "1")
    mode = f"{mx.default_device()}, MLX_CUDA_USE_CUDNN_SDPA={cudnn}"

    def forward_ms(length: int) -> float:
        return timed_ms(lambda: measure_pass(model, length))

    forward_ms(64)
    forward_ms(64)
    new = [forward_ms(length) for length in range(400, 412)]
    seen = [forward_ms(length) for length in range(400, 412)]
    print(f"{mode}: new  {_row(new, 1)} ms", flush=True)
    print(f"{mode}: seen {_row(seen, 1)} ms", flush=True)
    for length in (512, 2048, 4096, 8192):
        forward_ms(length)
        best = min(forward_ms(length) for _ in range(3))
        print(f"{mode}: {length} tokens {best:.1f} ms, {length / best * 1e3:.0f} tok/s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=("ops", "model"))
    parser.add_argument("folder", nargs="?", help="the mlx-lm folder (the model probe)")
    args = parser.parse_args(argv)
    if args.probe == "ops":
        if args.folder is not None:
            parser.error("the ops probe takes no folder")
        probe_ops()
        return 0
    if args.folder is None:
        parser.error("the model probe needs an mlx-lm folder")
    from mlxcel_models.errors import ModelLoadError

    try:
        probe_model(args.folder)
    except ModelLoadError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
