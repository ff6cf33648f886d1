"""The GGUF architectures (`general.architecture`) the GGUF loader builds, and their layout.

The answer for each family's GGUF support (`FamilyMetadata.formats`): an architecture
listed here loads from GGUF files with the tensor-name map in `gguf_model`.
"""

from __future__ import annotations

_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
# llama.cpp's converter permutes these architectures' Q/K rows for its interleaved RoPE.
_ROPE_PERMUTED = frozenset({"llama"})


def gguf_architectures() -> frozenset[str]:
    """The `general.architecture` values the GGUF loader maps onto mlx-lm models."""
    return _ARCHITECTURES


def gguf_rope_permuted(architecture: str) -> bool:
    """Whether llama.cpp's converter permuted this architecture's Q/K projection rows,
    which the loader permutes back."""
    return architecture in _ROPE_PERMUTED
