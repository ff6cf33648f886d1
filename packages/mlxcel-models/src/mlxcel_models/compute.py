"""How a loaded model computes: activation dtype, dense or quantized weights, CPU forms."""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map, tree_unflatten

from mlxcel_core.kernels import METAL, kernel_backend, quantized_linear
from mlxcel_models.cpu_layers import apply_cpu_layers
from mlxcel_models.cpu_ops import install_cpu_ops

# Rows of input from which quantized layers dequantize for a dense GEMM (prefill chunks).
CPU_DEQUANTIZE_MIN_ROWS = 4
# Dense weights may take up to this fraction of the CPU's memory (docs/adr/0004).
CPU_DENSE_WEIGHTS_MEMORY_FRACTION = 0.25
# Rows from which quantized layers on a CUDA GPU dequantize for a cuBLAS GEMM: at 64 rows
# MLX's CUDA `quantized_matmul` took 445 µs for a 4096x14336 weight against 130 µs for
# its bf16 copy on one H200 (DESIGN.md); dequantizing reads 4 bits and writes 16 per weight
# once more (docs/adr/0020-quantized-matvec-kernel.md).
CUDA_DEQUANTIZE_MIN_ROWS = 16


class CpuBlas(StrEnum):
    """The BLAS MLX's CPU matrix products run on in a process."""

    OPENBLAS = "OpenBLAS"
    REFERENCE = "reference BLAS"


# The smallest batch (sequences decoded together) from which quantized weights are made
# dense float32 on the CPU, per BLAS. Below it the file's quantized form is kept: it holds
# 4-6x less memory, and at one sequence it decodes as fast with the reference BLAS and about
# 25% slower with OpenBLAS; from it dense decodes 2.6-5x faster (docs/adr/0004, 0029).
CPU_DENSE_MIN_BATCH = {CpuBlas.OPENBLAS: 2, CpuBlas.REFERENCE: 4}
# CPU streams a linear layer's product is split over, at most one per core: measured on 2
# cores (docs/adr/0035-cpu-products-split-over-streams.md); more were not measured.
CPU_MAX_PRODUCT_STREAMS = 2


def cpu_product_streams() -> int:
    """The CPU streams each linear layer's product is split over in this process: one per
    core it may run on, at most `CPU_MAX_PRODUCT_STREAMS`."""
    return max(1, min(os.cpu_count() or 1, CPU_MAX_PRODUCT_STREAMS))


@dataclass(frozen=True)
class ComputeOptions:
    """Per-device choices applied to a model after its weights are read.

    Attributes:
        float_dtype: dtype for the float parameters (norms, quantization scales and biases,
            unquantized weights), which sets the activations' dtype; None keeps the file's.
        dequantize_min_rows: quantized linear layers given at least this many rows of input
            multiply by their dequantized weight (see `quantized_linear`); None never does.
        dense_weights_max_bytes: affine-quantized linear and embedding layers are replaced
            by dense ones, dequantized once at load to `float_dtype`, when all of them take
            at most this many bytes dense; then `dequantize_min_rows` has nothing left to
            act on. None keeps the quantized layers.
        kernel_linear: quantized linear layers kept quantized go through
            `quantized_linear` even with `dequantize_min_rows` None, so its matvec kernel
            serves decode rows.
        cpu_ops: RoPE and RMSNorm take their CPU forms, SwiGLU MLPs the CPU activation
            kernel (`mlxcel_models.cpu_ops`) and dense linear layers the CPU products of
            `mlxcel_models.cpu_layers` (a kernel at decode rows): fewer operations per step
            where each costs host time.
        cpu_streams: CPU cores each linear layer's product (and tied output projection)
            may use: MLX's products are split by output columns over this many CPU
            streams (`mlxcel_core.kernels.stream_split`), the C kernels over two threads
            from 2; 1 does not split.
    """

    float_dtype: mx.Dtype | None = None
    dequantize_min_rows: int | None = None
    dense_weights_max_bytes: int | None = None
    kernel_linear: bool = False
    cpu_ops: bool = False
    cpu_streams: int = 1

    def __post_init__(self) -> None:
        if self.cpu_streams < 1:
            raise ValueError(f"cpu_streams must be >= 1, got {self.cpu_streams}")
        if self.dequantize_min_rows is not None and self.dequantize_min_rows < 1:
            raise ValueError(f"dequantize_min_rows must be >= 1, got {self.dequantize_min_rows}")
        if self.dense_weights_max_bytes is not None and self.dense_weights_max_bytes < 0:
            raise ValueError(
                f"dense_weights_max_bytes must be None or >= 0, got {self.dense_weights_max_bytes}"
            )

    @property
    def dense_dtype(self) -> mx.Dtype:
        """The dtype quantized layers take when they are made dense."""
        return self.float_dtype or mx.float32

    def makes_dense(self, dense_bytes: int) -> bool:
        """Whether quantized layers taking `dense_bytes` when dense are made dense at load."""
        limit = self.dense_weights_max_bytes
        return limit is not None and dense_bytes <= limit

    @classmethod
    def for_device(
        cls, device: mx.Device, *, max_batch: int | None = None, blas: CpuBlas = CpuBlas.OPENBLAS
    ) -> ComputeOptions:
        """The measured best choice for `device` (docs/adr/0003, 0004, 0029).

        On the CPU, float16 arithmetic has no fast path and quantized products skip BLAS,
        so activations run in float32, prefill chunks multiply by dequantized weights,
        RoPE, RMSNorm and the SwiGLU activation take their CPU forms (`cpu_ops`), and linear
        layers split their products over `cpu_product_streams()` streams. Quantized weights
        are made dense float32 at load when the command decodes at least
        `CPU_DENSE_MIN_BATCH[blas]` sequences together (`max_batch`; None: batches of any
        size) and they fit in a quarter of the memory; otherwise the file's quantized form
        is kept. On a CUDA GPU the file's dtypes are kept, and quantized layers go through
        `quantized_linear`: its kernel for decode rows, a dequantized GEMM from
        `CUDA_DEQUANTIZE_MIN_ROWS` rows. Elsewhere (Apple GPUs) the file's dtypes and MLX's
        quantized kernels are kept; with the Metal kernels on
        (`mlxcel_core.kernels.KernelOptions`), decode rows take the matvec kernel.

        Raises:
            ValueError: `max_batch` < 1.
        """
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be None or >= 1, got {max_batch}")
        if device.type == mx.DeviceType.cpu:
            memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            dense = max_batch is None or max_batch >= CPU_DENSE_MIN_BATCH[blas]
            return cls(
                float_dtype=mx.float32,
                dequantize_min_rows=CPU_DEQUANTIZE_MIN_ROWS,
                dense_weights_max_bytes=(
                    int(memory * CPU_DENSE_WEIGHTS_MEMORY_FRACTION) if dense else None
                ),
                cpu_ops=True,
                cpu_streams=cpu_product_streams(),
            )
        if mx.cuda.is_available():
            return cls(dequantize_min_rows=CUDA_DEQUANTIZE_MIN_ROWS)
        return cls(kernel_linear=kernel_backend(device) is METAL)


class PrefillDequantizingLinear(nn.QuantizedLinear):
    """An affine `QuantizedLinear` whose product is `quantized_linear`'s: the matvec
    kernel for decode rows on a GPU, a dense product for long inputs.

    Parameters and their names are those of `nn.QuantizedLinear`, so anything that walks
    the model's parameters (saving, adapters) sees no difference.
    """

    dequantize_min_rows: int | None
    cpu_streams: int

    @classmethod
    def replacing(
        cls, layer: nn.QuantizedLinear, min_rows: int | None, cpu_streams: int = 1
    ) -> PrefillDequantizingLinear:
        """A layer with `layer`'s parameters; the constructor's random init is never run."""
        input_dims = layer.weight.shape[1] * 32 // layer.bits
        replacement = cls(
            input_dims,
            layer.weight.shape[0],
            bias="bias" in layer,
            group_size=layer.group_size,
            bits=layer.bits,
        )
        replacement.update(layer.parameters())
        replacement.dequantize_min_rows = min_rows
        replacement.cpu_streams = cpu_streams
        return replacement

    def __call__(self, x: mx.array) -> mx.array:
        return quantized_linear(
            x,
            self["weight"],
            self["scales"],
            self["biases"],
            group_size=self.group_size,
            bits=self.bits,
            bias=self.get("bias"),
            dequantize_min_rows=self.dequantize_min_rows,
            cpu_streams=self.cpu_streams,
        )


def _quantized_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    return [
        (name, layer)
        for name, layer in module.named_modules()
        if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)) and layer.mode == "affine"
    ]


def _dense_weight(layer: nn.Module, dtype: mx.Dtype) -> mx.array:
    weight = mx.dequantize(
        layer["weight"],
        layer["scales"],
        layer["biases"],
        group_size=layer.group_size,
        bits=layer.bits,
    )
    return weight.astype(dtype)


def _dense_layer(layer: nn.Module, dtype: mx.Dtype) -> nn.Module:
    """`layer` with its weight dequantized; the constructor's random init is replaced."""
    rows, packed = layer["weight"].shape
    columns = packed * 32 // layer.bits
    if isinstance(layer, nn.QuantizedEmbedding):
        dense: nn.Module = nn.Embedding(rows, columns)
    else:
        dense = nn.Linear(columns, rows, bias="bias" in layer)
        if "bias" in layer:
            dense.bias = layer["bias"].astype(dtype)
    dense.weight = _dense_weight(layer, dtype)
    return dense


def apply_compute_options(module: nn.Module, options: ComputeOptions) -> None:
    """Cast float parameters, make quantized layers dense or install the prefill tactic,
    and install the CPU forms of RoPE, RMSNorm and the SwiGLU activation, in place, before
    evaluation."""
    if options.float_dtype is not None:
        dtype = options.float_dtype
        module.update(
            tree_map(
                lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a,
                module.parameters(),
            )
        )
    quantized = _quantized_layers(module)
    dtype = options.dense_dtype
    dense_bytes = sum(
        layer["weight"].shape[0] * layer["weight"].shape[1] * 32 // layer.bits * dtype.size
        for _, layer in quantized
    )
    if quantized and options.makes_dense(dense_bytes):
        module.update_modules(
            tree_unflatten([(name, _dense_layer(layer, dtype)) for name, layer in quantized])
        )
    elif options.dequantize_min_rows is not None or options.kernel_linear:
        replacements = [
            (
                name,
                PrefillDequantizingLinear.replacing(
                    layer, options.dequantize_min_rows, options.cpu_streams
                ),
            )
            for name, layer in module.named_modules()
            if type(layer) is nn.QuantizedLinear and layer.mode == "affine"
        ]
        module.update_modules(tree_unflatten(replacements))
    if options.cpu_ops or options.cpu_streams > 1:
        apply_cpu_layers(module, options.cpu_streams)
    if options.cpu_ops:
        install_cpu_ops(module, cpu_streams=options.cpu_streams)


def has_quantized_layers(module: nn.Module) -> bool:
    """Whether `module` holds affine-quantized linear or embedding layers (kept as the file
    stores them, not made dense)."""
    return bool(_quantized_layers(module))
