"""The custom kernels' flag: `--metal-kernels` (`MLXCEL_METAL_KERNELS=1`) runs mlxcel's
Metal kernels on an Apple GPU instead of the plain-MLX paths; they are not yet verified on
Apple hardware (docs/metal-kernels.md). On CUDA the kernels always run."""

from __future__ import annotations

import argparse

from mlxcel.common.flags import Flag
from mlxcel_core.kernels import KernelOptions, install_kernel_options

METAL_KERNELS_FLAG = Flag(
    ("--metal-kernels",), "metal_kernels", bool, False,
    "run mlxcel's Metal kernels on an Apple GPU (not yet verified on Apple hardware: "
    "compare with `mlxcel bench`; docs/metal-kernels.md)",
    env="MLXCEL_METAL_KERNELS", is_switch=True,
)  # fmt: skip


def apply_kernel_flags(args: argparse.Namespace) -> None:
    """Install the kernel options of resolved `args` for the kernels' callers (the KV
    cache, the sampler, quantized layers), before the model loads."""
    install_kernel_options(KernelOptions(metal_kernels=args.metal_kernels))
