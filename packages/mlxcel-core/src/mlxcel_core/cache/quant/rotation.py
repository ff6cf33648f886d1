"""The random orthogonal rotation TurboQuant applies before quantizing: a randomized
Walsh-Hadamard transform, R = diag(s) H / sqrt(D) with random signs s in {-1, +1}.

H is Sylvester's Hadamard matrix (D a power of two), so R is orthogonal and its product
with a vector is the fast Walsh-Hadamard transform of the sign-flipped vector. The signs
come from a fixed seed per head dim, so every process encodes and decodes alike.
"""

from __future__ import annotations

import functools

import numpy as np

ROTATION_SEED = 20250425


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@functools.cache
def hadamard_rotation(head_dim: int) -> np.ndarray:
    """The (D, D) float32 rotation R; a row vector x rotates as x @ R, back as y @ R.T.

    Raises:
        ValueError: `head_dim` is not a power of two.
    """
    hadamard = np.ones((1, 1))
    while hadamard.shape[0] < head_dim:
        hadamard = np.block([[hadamard, hadamard], [hadamard, -hadamard]])
    signs = rotation_signs(head_dim).astype(np.float64)
    rotation = (signs[:, None] * hadamard / np.sqrt(head_dim)).astype(np.float32)
    rotation.setflags(write=False)
    return rotation


@functools.cache
def rotation_signs(head_dim: int) -> np.ndarray:
    """The (D,) float32 random signs s of R: R[p, i] = s[p] (-1)^popcount(p & i) / sqrt(D),
    Sylvester's H having entry (-1)^popcount(p & i), so a kernel can form any entry of R.

    Raises:
        ValueError: `head_dim` is not a power of two.
    """
    if not is_power_of_two(head_dim):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")
    signs = np.random.default_rng([ROTATION_SEED, head_dim]).choice([-1.0, 1.0], head_dim)
    signs = signs.astype(np.float32)
    signs.setflags(write=False)
    return signs
