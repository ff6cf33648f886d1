"""RoPE and RMSNorm in fewer MLX operations, for models that run on the CPU.

On a GPU, `mx.fast.rope` and `mx.fast.rms_norm` are one kernel each. On the CPU, MLX builds
them from primitives at every call: about 16 operations for RoPE (positions, frequencies,
cosines, sines, the rotation) and 11 for RMSNorm, each with its own dispatch and buffer,
which in a 30-layer model is about two thirds of a decode step's operations. Here:

- `TableRoPE` computes the cosines and sines of a forward pass's positions once, for the
  first layer, and hands the same arrays to every later layer (they rotate at the same
  positions), then rotates with one function compiled by `mx.compile`, which fuses its
  element-wise work;
- `CompiledRMSNorm` runs `mx.fast.rms_norm` compiled, which fuses its element-wise work on
  either side of the reduction.

Both give the same values as the fast functions they replace, computed in the same order
(MLX's own CPU fallbacks); `install_cpu_ops` swaps them into a model, and gives its SwiGLU
MLPs the CPU activation kernel (`mlxcel_models.cpu_mlp`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from mlxcel_core.kernels import cpu_matvec
from mlxcel_models.cpu_mlp import install_kernel_swiglu, is_swiglu_mlp
from mlxcel_models.rope import FrequencyFactorRoPE


@mx.compile
def _rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, weight, eps)


@mx.compile
def _rotate_halves(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    parts = [x1 * cos - x2 * sin, x1 * sin + x2 * cos]
    if x.shape[-1] > 2 * half:
        parts.append(x[..., 2 * half :])
    return mx.concatenate(parts, axis=-1)


@mx.compile
def _rotate_pairs(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    dims = 2 * cos.shape[-1]
    x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
    rotated = mx.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    rotated = rotated.reshape(*x.shape[:-1], dims)
    if x.shape[-1] == dims:
        return rotated
    return mx.concatenate([rotated, x[..., dims:]], axis=-1)


class CompiledRMSNorm(nn.Module):
    """`nn.RMSNorm` through a compiled `mx.fast.rms_norm`; same parameter (`weight`).

    Args:
        norm: the layer replaced; its weight and epsilon are taken.
    """

    def __init__(self, norm: nn.RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps

    def __call__(self, x: mx.array) -> mx.array:
        return _rms_norm(x, self.weight, self.eps)


class _HeldEntry(threading.local):
    """((offset, length, owner), (cos, sin)), one per thread, replaced whole so a reader
    never sees one pass's key with another's values. Two threads running passes of one
    model (a prefill rank beside an engine in one process) each hold their own: an entry
    still being computed on one thread's stream cannot be evaluated on another's."""

    entry: tuple[tuple[int | mx.array, int, Hashable], tuple[mx.array, mx.array]] = (
        (-1, 0, None),
        (mx.array(0.0), mx.array(0.0)),
    )


class RopeTable:
    """The cosines and sines of the latest positions asked for, shared by a model's layers.

    One forward pass asks every layer for the same positions: an offset (an int, or the
    same (B,) int32 array of per-row offsets for every layer of a paged batch) and a query
    length. The table keeps the offset it was computed for, so an array is never mistaken
    for a later one that reuses its memory.
    """

    def __init__(self) -> None:
        self._held = _HeldEntry()

    def lookup(
        self, owner: Hashable, offset: int | mx.array, length: int, inv_freqs: mx.array
    ) -> tuple[mx.array, mx.array]:
        """Cosines and sines of `(offset + i) * inv_freqs` for i < `length`.

        Args:
            owner: which frequencies these are: equal for RoPEs of equal settings.
            offset: the first position (an int or a 0-d int32 array), or (B,) int32 first
                positions, one per row.
            length: the query positions L.
            inv_freqs: (D / 2,) float32 inverse wavelengths, the position scale included.

        Returns:
            (cos, sin), each (L, D / 2) for one first position or (B, 1, L, D / 2) for one
            per row.
        """
        (held_offset, held_length, held_owner), value = self._held.entry
        if (held_length, held_owner) == (length, owner) and (
            held_offset is offset
            or (isinstance(offset, int) and isinstance(held_offset, int) and held_offset == offset)
        ):
            return value
        if isinstance(offset, int):
            positions = mx.arange(offset, offset + length, dtype=mx.float32)
        elif offset.ndim == 0:
            positions = (offset + mx.arange(length)).astype(mx.float32)
        else:
            positions = (offset[:, None] + mx.arange(length))[:, None, :].astype(mx.float32)
        theta = positions[..., None] * inv_freqs
        value = (mx.cos(theta), mx.sin(theta))
        self._held.entry = ((offset, length, owner), value)
        return value


class TableRoPE(nn.Module):
    """Rotary position embedding from a `RopeTable` shared with the model's other layers.

    Args:
        dims: rotated features per head.
        inv_freqs: (dims / 2,) float32 inverse wavelengths times the position scale;
            RoPEs of equal `dims` and `inv_freqs` share the table's cosines and sines.
        traditional: rotate interleaved pairs instead of the two halves.
        table: the model's shared table.
        base: the replaced `nn.RoPE`'s base, None for a `FrequencyFactorRoPE`; kept with
            `scale` as `nn.RoPE` has them, for model code that reads them (mlx-lm's
            muse_spark hands `rope.base` to its fused query/key kernel).
        scale: the replaced `nn.RoPE`'s position scale (already in `inv_freqs`).
    """

    def __init__(
        self,
        dims: int,
        inv_freqs: mx.array,
        *,
        traditional: bool,
        table: RopeTable,
        base: float | None = None,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.dims = dims
        self.traditional = traditional
        self.base = base
        self.scale = scale
        self._inv_freqs = inv_freqs
        self._table = table
        self._owner = (dims, tuple(inv_freqs.tolist()))

    @classmethod
    def replacing(cls, rope: nn.Module, table: RopeTable) -> TableRoPE | None:
        """The replacement of a supported RoPE module (`nn.RoPE`, `FrequencyFactorRoPE`),
        or None for any other kind (they keep `mx.fast.rope`)."""
        if type(rope) is nn.RoPE:
            half = rope.dims // 2
            exponents = mx.arange(0, -half, -1, dtype=mx.float32)
            inv_freqs = mx.exp(exponents * (math.log(rope.base) / half)) * rope.scale
            return cls(
                rope.dims,
                inv_freqs,
                traditional=rope.traditional,
                table=table,
                base=rope.base,
                scale=rope.scale,
            )
        if type(rope) is FrequencyFactorRoPE:
            inv_freqs = mx.reciprocal(rope.freqs)
            return cls(rope.dims, inv_freqs, traditional=rope.traditional, table=table)
        return None

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        cos, sin = self._table.lookup(self._owner, offset, x.shape[-2], self._inv_freqs)
        if cos.dtype != x.dtype:
            cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
        rotate = _rotate_pairs if self.traditional else _rotate_halves
        return rotate(x, cos, sin)


def install_cpu_ops(module: nn.Module, *, cpu_streams: int = 1) -> int:
    """Swap `CompiledRMSNorm` for every `nn.RMSNorm` and `TableRoPE` for every supported
    RoPE module of `module`, all RoPEs sharing one table, and where the CPU kernels are
    built (`cpu_matvec.available`), give mlx-lm's SwiGLU MLPs the kernel's activation
    (`mlxcel_models.cpu_mlp`); in place.

    Args:
        module: the model.
        cpu_streams: cores the MLPs' activation may use, >= 1.

    Returns:
        The number of layers replaced or changed.
    """
    table = RopeTable()
    replacements: list[tuple[str, nn.Module]] = []
    swiglu_mlps: list[nn.Module] = []
    for name, layer in module.named_modules():
        if type(layer) is nn.RMSNorm:
            replacements.append((name, CompiledRMSNorm(layer)))
        elif (rope := TableRoPE.replacing(layer, table)) is not None:
            replacements.append((name, rope))
        elif is_swiglu_mlp(layer):
            swiglu_mlps.append(layer)
    if replacements:
        module.update_modules(tree_unflatten(replacements))
    # Asked only now: a model without such MLPs does not build the library.
    if not swiglu_mlps or not cpu_matvec.available():
        return len(replacements)
    for mlp in swiglu_mlps:
        install_kernel_swiglu(mlp, cpu_streams)
    return len(replacements) + len(swiglu_mlps)
