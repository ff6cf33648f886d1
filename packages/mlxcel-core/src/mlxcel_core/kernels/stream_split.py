"""Linear-layer products split by output columns over several CPU streams.

MLX's CPU backend runs each stream's operations on one thread, and its quantized matrix
product is single-threaded, so one layer's product uses one core whatever the machine has.
Each stream here computes a contiguous block of the output columns from the matching rows
of the weight (slices of the packed weight, scales and biases are views, not copies), and
the blocks are concatenated: the cores share each product's weight reads and arithmetic
(docs/adr/0035-cpu-products-split-over-streams.md).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxcel_core.threads import side_streams

# Output columns below which a product is not split: the extra operations cost more than
# a core saves on a product this small.
MIN_SPLIT_COLUMNS = 256
# Rows of input above which a product is not split: decode steps gain (a SmolLM2 forward
# pass of 16 rows with dense float32 weights took 149 ms split against 197 ms whole), but
# a prefill chunk's OpenBLAS GEMMs called from two threads at once ran no faster than one
# after the other, so splitting those only adds operations (128 rows: 704 ms split
# against 650 ms whole).
MAX_SPLIT_ROWS = 16
_CPU = mx.Device(mx.cpu)

# product(block, stream) -> the output columns `block` (None: all of them) computed on
# `stream` (None: the current one), from the weight rows `block` selects.
ColumnProduct = Callable[[slice | None, mx.Stream | None], mx.array]


def _rows(array: mx.array, block: slice | None) -> mx.array:
    return array if block is None else array[block]


def split_columns(
    product: ColumnProduct, columns: int, num_streams: int, *, rows: int = 1
) -> mx.array:
    """`product`'s whole output, its columns computed in `num_streams` blocks on as many
    of this thread's CPU streams (`mlxcel_core.threads.side_streams`).

    Args:
        product: computes the output columns of a block on the given stream; called once
            with (None, None) when the product is not split, so that path adds no
            operation.
        columns: the output's last dimension N.
        num_streams: streams to split over; 1, fewer columns than `MIN_SPLIT_COLUMNS` or
            more rows than `MAX_SPLIT_ROWS` compute the product whole on the current
            stream.
        rows: rows of the product's input (all leading axes together).

    Returns:
        (..., N) the concatenated blocks.
    """
    if num_streams <= 1 or columns < MIN_SPLIT_COLUMNS or rows > MAX_SPLIT_ROWS:
        return product(None, None)
    streams = side_streams(_CPU, num_streams)
    bounds = [columns * i // num_streams for i in range(num_streams + 1)]
    blocks = [
        product(slice(start, stop), stream)
        for start, stop, stream in zip(bounds, bounds[1:], streams, strict=False)
    ]
    return mx.concatenate(blocks, axis=-1)


def split_dense_product(x: mx.array, weight: mx.array, num_streams: int) -> mx.array:
    """`x @ weight.T` split by output columns over CPU streams.

    Args:
        x: (..., K) float activations.
        weight: (N, K) dense weight of x's dtype.
        num_streams: see `split_columns`.

    Returns:
        (..., N) in x's dtype.
    """
    return split_columns(
        lambda block, stream: mx.matmul(x, _rows(weight, block).T, stream=stream),
        weight.shape[0],
        num_streams,
        rows=x.size // x.shape[-1],
    )


def split_quantized_product(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    num_streams: int,
) -> mx.array:
    """`mx.quantized_matmul(x, weight, scales, biases, transpose=True)` split by output
    columns over CPU streams.

    Args:
        x: (..., K) float activations.
        weight: (N, K * bits / 32) uint32 packed affine-quantized weight.
        scales, biases: (N, K / group_size) per-group scales and offsets.
        group_size, bits: the quantization's group size (elements) and bits per element.
        num_streams: see `split_columns`.

    Returns:
        (..., N) in x's dtype.
    """
    return split_columns(
        lambda block, stream: mx.quantized_matmul(
            x,
            _rows(weight, block),
            _rows(scales, block),
            _rows(biases, block),
            transpose=True,
            group_size=group_size,
            bits=bits,
            stream=stream,
        ),
        weight.shape[0],
        num_streams,
        rows=x.size // x.shape[-1],
    )


def split_dequantized_product(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    num_streams: int,
) -> mx.array:
    """`x @ dequantize(weight).T`, each stream dequantizing its block of the weight's rows
    to x's dtype and multiplying by it (a BLAS GEMM on the CPU): the prefill tactic.

    Shapes and arguments as `split_quantized_product`.
    """
    # Without the dependency on x, MLX may dequantize the weights of many layers before it
    # needs any of them, holding all their dense copies at once.
    (weight,) = mx.depends([weight], [x])

    def dense_block(block: slice | None, stream: mx.Stream | None) -> mx.array:
        dense = mx.dequantize(
            _rows(weight, block),
            _rows(scales, block),
            _rows(biases, block),
            group_size=group_size,
            bits=bits,
            stream=stream,
        )
        return mx.matmul(x, dense.astype(x.dtype, stream=stream).T, stream=stream)

    return split_columns(dense_block, weight.shape[0], num_streams, rows=x.size // x.shape[-1])
