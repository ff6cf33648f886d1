"""Kernel sources written once: the template renderer, which backend's kernels serve a
device, and what every kernel registers with MLX on each backend (the sources themselves
run on CPU threads in test_cuda_sources_on_cpu.py, test_metal_sources_on_cpu.py and the
kernels' own tests)."""

from __future__ import annotations

import re

import mlx.core as mx
import pytest
from kernel_caches import kernels_built_by
from test_turbo_metal_kernels import CUDA_ONLY

from mlxcel_core.kernels import (
    BACKENDS,
    CUDA,
    METAL,
    KernelOptions,
    install_kernel_options,
    kernel_backend,
    options,
    turbo_encode,
)
from mlxcel_core.kernels.gumbel_sampling import kernel as gumbel_kernel
from mlxcel_core.kernels.paged_attention import decode, turbo
from mlxcel_core.kernels.quantized_matvec import kernel as matvec_kernel

# What only Metal spells: its address spaces, thread attributes, barriers and namespace.
METAL_ONLY = re.compile(
    r"\b(?:threadgroup|device|thread|constant)\s|thread_position|threadgroups_per_grid"
    r"|threadgroup_barrier|metal::|simd_\w+|as_type<|-INFINITY"
)


def test_words_are_spelled_per_backend_with_their_arguments_in_place():
    template = "float m = $max(a, $exp2(x[i, j]));\nx = $shuffle_xor(best, offset);"
    assert CUDA.render(template) == (
        "float m = fmaxf(a, exp2f(x[i, j]));\nx = __shfl_xor_sync(0xffffffff, best, offset);"
    )
    assert METAL.render(template) == (
        "float m = metal::max(a, metal::exp2(x[i, j]));\n"
        "x = simd_shuffle_xor(best, ushort(offset));"
    )
    assert METAL.render("const ${device}T* q = $block.x;") == (
        "const device T* q = threadgroup_position_in_grid.x;"
    )


def test_a_fragment_alone_on_its_line_is_indented_there_and_an_empty_one_drops_the_line():
    template = "{\n  $body\n  $unroll\n  for (;;) {}\n}"
    body = "if (x) {\n  y = $min(a, b);\n}"
    assert CUDA.render(template, body=body) == (
        "{\n  if (x) {\n    y = min(a, b);\n  }\n  #pragma unroll\n  for (;;) {}\n}"
    )
    assert METAL.render(template, body="") == "{\n  for (;;) {}\n}"


def test_an_unknown_placeholder_or_missing_arguments_are_refused():
    with pytest.raises(KeyError, match="nowhere"):
        CUDA.render("x = $nowhere;")
    with pytest.raises(ValueError, match="needs them in parentheses"):
        CUDA.render("x = $shuffle_xor;")
    with pytest.raises(ValueError, match="unbalanced"):
        METAL.render("x = $shuffle_xor(a, (b);")


@pytest.fixture
def devices(monkeypatch):
    """An Apple GPU and no CUDA, as `kernel_backend` sees them; the options reset after."""
    monkeypatch.setattr(options, "_cuda_available", lambda: False)
    monkeypatch.setattr(options, "_metal_available", lambda: True)
    yield
    install_kernel_options(KernelOptions())


def test_the_metal_kernels_serve_an_apple_gpu_only_when_turned_on(devices):
    gpu = mx.Device(mx.gpu)
    assert kernel_backend(gpu) is None
    install_kernel_options(KernelOptions(metal_kernels=True))
    assert kernel_backend(gpu) is METAL
    assert kernel_backend(mx.Device(mx.cpu)) is None


def test_cuda_kernels_serve_a_cuda_gpu_whatever_the_options(devices, monkeypatch):
    monkeypatch.setattr(options, "_cuda_available", lambda: True)
    for metal_kernels in (False, True):
        install_kernel_options(KernelOptions(metal_kernels=metal_kernels))
        assert kernel_backend(mx.Device(mx.gpu)) is CUDA


def registered(monkeypatch, backend) -> dict[str, dict[str, object]]:
    """Every kernel's definition as `backend`'s builder is handed it, by name."""
    definitions: dict[str, dict[str, object]] = {}

    def build(**definition):
        definitions[definition["name"]] = definition
        return definition

    with kernels_built_by(monkeypatch, backend, build):
        for module in (decode, turbo, turbo_encode):
            module.kernels(backend)
        for module in (matvec_kernel, gumbel_kernel):
            module.kernel(backend)
    return definitions


def test_both_backends_register_the_same_kernels_each_spelled_in_its_own_words(monkeypatch):
    cuda, metal = (registered(monkeypatch, backend) for backend in BACKENDS)
    assert len(cuda) == 10 and cuda.keys() == metal.keys()
    for name, definition in cuda.items():
        for field in ("input_names", "output_names"):
            assert definition[field] == metal[name][field], name
    for backend, definitions, foreign in ((CUDA, cuda, METAL_ONLY), (METAL, metal, CUDA_ONLY)):
        for name, definition in definitions.items():
            text = definition["source"] + definition["header"]
            assert "$" not in text, f"{backend.name} {name}: a placeholder left unspelled"
            assert not foreign.search(text), f"{backend.name} {name}: {foreign.search(text)}"
            assert text.count("{") == text.count("}"), name
            assert text.count("(") == text.count(")"), name
