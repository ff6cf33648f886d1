"""The searches `mlxcel tune` runs: the engine's prefill chunk on the loaded model, and the
CUDA paged decode kernel's split count on random pools of the model's attention shape."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import mlx.core as mx

from mlxcel.common.flags import RunError
from mlxcel_core.autotune import SearchResult, search
from mlxcel_core.autotune.paged_decode import DecodeKernelProblem, partition_candidates
from mlxcel_core.autotune.prefill import EnginePrefill
from mlxcel_core.engine import InsufficientMemoryError
from mlxcel_core.kernels.paged_attention import decode_kernel_backend
from mlxcel_core.tuning import (
    PAGED_DECODE_PARTITIONS,
    PREFILL_CHUNK,
    next_power_of_two,
    paged_decode_bucket,
)
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.memory import ModelInventory, activation_dtype

# Tokens per KV block, the engine's default (`--block-size`).
BLOCK_SIZE = 16


def search_prefill_chunk(
    loaded: LoadedModel,
    bucket: str,
    *,
    prompt_tokens: int,
    candidates: Sequence[int],
    default: int,
    rounds: int,
    on_round: Callable[[int], object],
) -> SearchResult:
    """Time the engine's prefill of a random prompt of `prompt_tokens` tokens with each
    of `candidates` (chunk sizes, `default` among them), calling `on_round` after each
    round; the engines are shut down on return, error or Ctrl-C.

    Raises:
        RunError: the engine cannot start (the prompt's KV cache does not fit).
    """
    key = mx.random.key(0)
    prompt = mx.random.randint(0, loaded.config.vocab_size, (prompt_tokens,), key=key).tolist()
    try:
        prefill = EnginePrefill(loaded.model, prompt, candidates, block_size=BLOCK_SIZE)
    except InsufficientMemoryError as error:
        raise RunError(str(error)) from error
    with prefill:
        return search(
            PREFILL_CHUNK,
            bucket,
            candidates,
            prefill,
            default=default,
            rounds=rounds,
            on_round=on_round,
        )


def decode_kernel_skip_reason(inventory: ModelInventory) -> str | None:
    """Why the paged decode kernel cannot be tuned for this model here, or None."""
    if not mx.cuda.is_available() or mx.default_device().type != mx.DeviceType.gpu:
        return "paged_decode_partitions needs a CUDA device; skipped"
    arch = inventory.architecture
    dtype = activation_dtype(inventory, ComputeOptions.for_device(mx.default_device()))
    head_dim = arch.head_dim
    if (
        decode_kernel_backend(
            mx.default_device(), dtype, arch.num_heads, arch.num_kv_heads, head_dim, head_dim
        )
        is None
    ):
        return (
            f"the paged decode kernel does not take this model's layers ({dtype}, head dim "
            f"{head_dim}); paged_decode_partitions skipped"
        )
    return None


def search_paged_decode_partitions(
    inventory: ModelInventory,
    *,
    rows: Sequence[int],
    contexts: Sequence[int],
    rounds: int,
    on_round: Callable[[str, int], object],
) -> Iterator[SearchResult]:
    """Time the kernel's split counts (`partition_candidates`) against `num_partitions_for`'s
    for the model's attention shape at every (rows, context) pair, both rounded up to a power
    of two (the context to at least one block): the top of their bucket. The kernel must take
    the model's layers here (`decode_kernel_skip_reason` is None). `on_round` is called
    with the bucket and the rounds done after each round."""
    arch = inventory.architecture
    dtype = activation_dtype(inventory, ComputeOptions.for_device(mx.default_device()))
    for row_count in rows:
        num_rows = next_power_of_two(row_count)
        for context in contexts:
            capacity = max(BLOCK_SIZE, next_power_of_two(context))
            problem = DecodeKernelProblem(
                dtype=dtype,
                num_q_heads=arch.num_heads,
                num_kv_heads=arch.num_kv_heads,
                head_dim=arch.head_dim,
                num_rows=num_rows,
                capacity_tokens=capacity,
                block_size=BLOCK_SIZE,
            )
            bucket = paged_decode_bucket(
                dtype=dtype,
                group_size=arch.num_heads // arch.num_kv_heads,
                head_dim=arch.head_dim,
                num_kv_heads=arch.num_kv_heads,
                num_rows=num_rows,
                capacity_tokens=capacity,
            )
            default = problem.default_partitions
            yield search(
                PAGED_DECODE_PARTITIONS,
                bucket,
                partition_candidates(capacity, default),
                problem,
                default=default,
                rounds=rounds,
                on_round=lambda done, bucket=bucket: on_round(bucket, done),
            )
            del problem  # free this shape's pools before the next shape's are made
