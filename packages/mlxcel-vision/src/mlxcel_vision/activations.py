"""The activations vision towers and projectors name in their configs (`hidden_act`)."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError

ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "gelu": nn.gelu,
    # CLIP's x * sigmoid(1.702 x).
    "quick_gelu": nn.gelu_fast_approx,
    "gelu_new": nn.gelu_approx,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "silu": nn.silu,
}
"""transformers' `ACT2FN` names and the MLX functions computing the same thing."""


def activation(name: str) -> Callable[[mx.array], mx.array]:
    """The activation a config names.

    Raises:
        ModelLoadError: the name is not one of `ACTIVATIONS`.
    """
    function = ACTIVATIONS.get(name)
    if function is None:
        raise ModelLoadError(
            f"unsupported activation '{name}'; supported: {', '.join(sorted(ACTIVATIONS))}"
        )
    return function
