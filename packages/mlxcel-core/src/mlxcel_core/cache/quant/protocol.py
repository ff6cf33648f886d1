"""The interface every KV cache codec implements, and the arrays it stores per slot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx


@dataclass(frozen=True)
class Component:
    """One array a codec stores per head-vector: `width` elements of `dtype`.

    A pool of S slots holds each component as an (S, H, width) array.
    """

    width: int
    dtype: mx.Dtype

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")

    @property
    def nbytes(self) -> int:
        """Bytes of one head-vector's part."""
        return self.width * self.dtype.size


class KVCodec(Protocol):
    """Encodes key or value head-vectors of one head dim into packed arrays, and back.

    Attributes:
        components: what `encode` returns, in order.
        centered: the paged storage should store each row's keys past its first block
            relative to that block's mean (`mlxcel_core.cache.paged.centering`): for
            codecs whose error is a fraction of the norm they are given. Values are
            never centered.
    """

    components: tuple[Component, ...]
    centered: bool

    def encode(self, x: mx.array) -> tuple[mx.array, ...]:
        """Pack head-vectors.

        Args:
            x: (N, H, D) float keys or values.

        Returns:
            One (N, H, width) array per component, in `components` order and dtypes.
        """
        ...

    def decode(self, parts: Sequence[mx.array], dtype: mx.Dtype) -> mx.array:
        """Unpack head-vectors.

        Args:
            parts: one (..., H, width) array per component, as `encode` made them.
            dtype: the dtype to return (the model's KV dtype).

        Returns:
            (..., H, D) head-vectors in `dtype`.
        """
        ...


def bytes_per_vector(codec: KVCodec) -> int:
    """Bytes one encoded head-vector takes, over all of `codec`'s components."""
    return sum(component.nbytes for component in codec.components)
