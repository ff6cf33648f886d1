"""benchmarks/step_ops.py --cuda-path on the CPU: the step CUDA would run, counted with kernel
stand-ins, launches each cache type's kernels and writes as the CUDA path does."""

from __future__ import annotations

import pytest

from mlxcel_core.kernels import options as kernel_options
from mlxcel_core.kernels import paged_attention
from mlxcel_models.compute import CUDA_DEQUANTIZE_MIN_ROWS, ComputeOptions
from mlxcel_models.loading.loader import load_model

from benchmark_scripts import load_benchmark

random_model = load_benchmark("random_model")
load_benchmark("batched_decode")
step_ops = load_benchmark("step_ops")

LAYERS = random_model.SHAPES["tiny"]["num_hidden_layers"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tiny")
    random_model.write_random_model("tiny", folder, bits=None)
    return load_model(folder, compute=ComputeOptions(dequantize_min_rows=CUDA_DEQUANTIZE_MIN_ROWS))


@pytest.mark.parametrize(
    ("cache_type", "kernels_per_layer", "scatters_per_layer"),
    # One-pass decode attention (a short context is one partition); TurboQuant adds an
    # encoder launch for keys and one for values, and stores four components of each.
    [("auto", 1, 2), ("turbo4", 3, 8)],
)
def test_a_cuda_decode_step_launches_each_layers_kernels_and_writes(
    tiny_model, cache_type, kernels_per_layer, scatters_per_layer
) -> None:
    with step_ops.cuda_path():
        ops = step_ops.decode_step_ops(
            tiny_model, 1, 40, 0.0, (cache_type, cache_type), cache_residual=0
        )

    assert ops["Kernel"] == kernels_per_layer * LAYERS
    assert ops["Scatter"] == scatters_per_layer * LAYERS
    assert paged_attention.kernel_backend is kernel_options.kernel_backend  # restored
