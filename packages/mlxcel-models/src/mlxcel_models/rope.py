"""RoPE with per-frequency scaling factors stored alongside the weights."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


class FrequencyFactorRoPE(nn.Module):
    """Rotary embedding whose i-th frequency is divided by `factors[i]`.

    This is how llama.cpp applies Llama 3.1-style RoPE scaling from a GGUF file: the
    converter stores the per-frequency factors as the `rope_freqs` tensor and attention
    rotates by `position * base^(-2i/dims) / factors[i]` (ggml's `freq_factors`). The result
    equals mlx-lm's `Llama3RoPE` for the scaling parameters the factors were made from.

    Args:
        dims: rotated features per head.
        base: RoPE base (`rope_theta`).
        factors: (dims / 2,) float factors, one per frequency.
        traditional: rotate interleaved pairs instead of the two halves.

    Raises:
        ValueError: `factors` does not have dims / 2 entries.
    """

    def __init__(
        self, dims: int, base: float, factors: mx.array, *, traditional: bool = False
    ) -> None:
        super().__init__()
        if factors.shape != (dims // 2,):
            raise ValueError(
                f"RoPE factors must have shape ({dims // 2},) for {dims} dims, "
                f"got {tuple(factors.shape)}"
            )
        self.dims = dims
        self.traditional = traditional
        # mx.fast.rope takes wavelength-like `freqs` and rotates by position / freqs.
        self._freqs = (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)) * factors.astype(
            mx.float32
        )

    @property
    def freqs(self) -> mx.array:
        """(dims / 2,) float32 wavelengths: each frequency's position divisor."""
        return self._freqs

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(
            x,
            self.dims,
            traditional=self.traditional,
            base=None,
            scale=1.0,
            offset=offset,
            freqs=self._freqs,
        )
