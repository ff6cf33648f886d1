"""What the CPU kernels' tests share: a mark for the built library, and the CPU as the
default device (on a machine with a GPU, the kernels are tested on its CPU)."""

import mlx.core as mx
import pytest

from mlxcel_core.kernels import cpu_matvec

needs_kernel = pytest.mark.skipif(
    not cpu_matvec.available(),
    reason=f"CPU kernels not built here: {cpu_matvec.native.native_library().reason}",
)


@pytest.fixture(autouse=True)
def on_the_cpu():
    """CPU kernels: on a machine with a GPU they are tested on its CPU."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)
