"""The tactics' names and shape buckets: which runs share one tuned value.

A bucket is text (`"dtype=bfloat16,group=4,..."`), the same when tuning and when reading
the value back, and readable in `mlxcel tune --show`.
"""

from __future__ import annotations

import mlx.core as mx

PREFILL_CHUNK = "prefill_chunk"
PAGED_DECODE_PARTITIONS = "paged_decode_partitions"
TACTICS = (PREFILL_CHUNK, PAGED_DECODE_PARTITIONS)


def next_power_of_two(value: int) -> int:
    """The smallest power of two >= `value` (1 for values below 2)."""
    return 1 if value < 2 else 1 << (value - 1).bit_length()


def dtype_name(dtype: mx.Dtype) -> str:
    """`mx.bfloat16` -> `"bfloat16"`."""
    return str(dtype).removeprefix("mlx.core.")


def prefill_bucket(
    *, model_type: str, num_layers: int, hidden_size: int, dtype: mx.Dtype, weights: str
) -> str:
    """The bucket of the prefill chunk: the model's shape as it computes.

    Args:
        model_type: the architecture (`"llama"`).
        num_layers: decoder layers.
        hidden_size: width of the residual stream.
        dtype: the activations' dtype.
        weights: how the linear layers are held (`"dense"`, `"4bit"`).
    """
    return (
        f"model={model_type},layers={num_layers},hidden={hidden_size},"
        f"dtype={dtype_name(dtype)},weights={weights}"
    )


def paged_decode_bucket(
    *,
    dtype: mx.Dtype,
    group_size: int,
    head_dim: int,
    num_kv_heads: int,
    num_rows: int,
    capacity_tokens: int,
) -> str:
    """The bucket of the paged decode kernel's split count: the layer's geometry, the
    rows rounded up to a power of two and the block tables' capacity (tokens) likewise."""
    return (
        f"dtype={dtype_name(dtype)},group={group_size},head_dim={head_dim},"
        f"kv_heads={num_kv_heads},rows={next_power_of_two(num_rows)},"
        f"capacity={next_power_of_two(capacity_tokens)}"
    )
