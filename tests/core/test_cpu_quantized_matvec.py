"""The CPU quantized matvec kernel against MLX's `quantized_matmul`, its place among
`quantized_linear`'s tactics, and how its C library is built, cached and refused."""

import platform
import shutil
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.kernels import cpu_matvec, quantized_linear
from mlxcel_core.kernels.cpu_matvec import cpu_quantized_matvec, native
from mlxcel_core.kernels.cpu_matvec.native import (
    LIBRARY_STEM,
    SOURCES,
    cache_directory,
    load_native_library,
)

# `on_the_cpu` is an autouse fixture.
from cpu_kernels import needs_kernel, on_the_cpu  # noqa: F401

can_build = pytest.mark.skipif(
    platform.machine() not in {"x86_64", "AMD64"} or shutil.which("cc") is None,
    reason="needs an x86-64 CPU and a C compiler",
)


def quantized_weight(rows: int, columns: int, bits: int, group_size: int, seed: int = 0):
    weight = mx.random.normal((rows, columns), key=mx.random.key(seed))
    return mx.quantize(weight, group_size=group_size, bits=bits)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_the_kernel_computes_what_quantized_matmul_computes(bits, group_size, rows):
    columns = 384
    packed, scales, biases = quantized_weight(72, columns, bits, group_size)
    x = mx.random.normal((rows, columns), key=mx.random.key(rows))
    expected = mx.quantized_matmul(
        x, packed, scales, biases, transpose=True, group_size=group_size, bits=bits
    )
    got = cpu_quantized_matvec(x, packed, scales, biases, group_size=group_size, bits=bits)
    assert got.shape == expected.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("outputs", [1, 77])
def test_two_threads_compute_what_one_computes(rows, outputs):
    packed, scales, biases = quantized_weight(outputs, 256, 8, 32, seed=outputs)
    x = mx.random.normal((rows, 256), key=mx.random.key(rows))
    one = cpu_quantized_matvec(x, packed, scales, biases, group_size=32, bits=8)
    two = cpu_quantized_matvec(x, packed, scales, biases, group_size=32, bits=8, threads=2)
    assert mx.array_equal(one, two)
    with pytest.raises(ValueError, match="refused K=256, group 32, 3 threads"):
        cpu_quantized_matvec(x, packed, scales, biases, group_size=32, bits=8, threads=3)


def test_only_large_products_split_and_only_with_a_second_core():
    large = -(-cpu_matvec.SPLIT_MIN_WEIGHTS // 576)  # the fewest outputs that split
    assert cpu_matvec.threads_for(1, 49152, 576, cpu_streams=2) == 2
    assert cpu_matvec.threads_for(1, large, 576, cpu_streams=2) == 2
    assert cpu_matvec.threads_for(1, large - 1, 576, cpu_streams=2) == 1
    assert cpu_matvec.threads_for(8, 1536, 576, cpu_streams=2) == 2
    assert cpu_matvec.threads_for(1, 49152, 576, cpu_streams=1) == 1


@needs_kernel
def test_leading_axes_are_kept_and_a_lazy_input_is_evaluated():
    packed, scales, biases = quantized_weight(40, 256, 4, 32)
    x = mx.random.normal((2, 1, 256)) * 0.5 + 1.0  # lazy until the kernel evaluates it
    got = cpu_quantized_matvec(x, packed, scales, biases, group_size=32, bits=4)
    expected = mx.quantized_matmul(x, packed, scales, biases, transpose=True, group_size=32)
    assert got.shape == (2, 1, 40)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-4)


@needs_kernel
def test_a_column_slice_of_the_activations_is_read_in_order():
    packed, scales, biases = quantized_weight(16, 128, 8, 64)
    wide = mx.random.normal((3, 256))
    x = wide[:, 64:192]  # not contiguous rows
    got = cpu_quantized_matvec(x, packed, scales, biases, group_size=64, bits=8)
    expected = mx.quantized_matmul(x, packed, scales, biases, transpose=True, group_size=64, bits=8)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("rows", "dtype", "bits", "group_size"),
    [
        (9, mx.float32, 4, 32),  # more rows than a decode batch
        (1, mx.float16, 4, 32),
        (1, mx.float32, 3, 32),
        (1, mx.float32, 4, 40),
    ],
)
def test_products_the_kernel_does_not_take_are_refused(rows, dtype, bits, group_size):
    packed, scales, biases = quantized_weight(8, 160 if group_size == 40 else 128, bits, 32)
    x = mx.zeros((rows, packed.shape[1] * 32 // bits), dtype=dtype)
    assert not cpu_matvec.supports(x, scales, biases, bits, group_size)
    with pytest.raises(ValueError, match="CPU quantized matvec kernel takes"):
        cpu_quantized_matvec(x, packed, scales, biases, group_size=group_size, bits=bits)


@needs_kernel
def test_quantized_linear_takes_the_kernel_for_decode_rows_only(monkeypatch):
    packed, scales, biases = quantized_weight(64, 256, 4, 64)
    calls = []
    kernel = cpu_matvec.cpu_quantized_matvec

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(cpu_matvec, "cpu_quantized_matvec", counted)
    for rows in (1, 8, 9):
        x = mx.random.normal((rows, 256))
        got = quantized_linear(x, packed, scales, biases, group_size=64, bits=4)
        expected = mx.quantized_matmul(x, packed, scales, biases, transpose=True, group_size=64)
        np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-4)
    assert calls == [(1, 256), (8, 256)]


def test_turned_off_by_the_environment(tmp_path):
    library = load_native_library({"MLXCEL_NO_CPU_KERNELS": "1", "MLXCEL_CACHE_DIR": str(tmp_path)})
    assert library.library is None
    assert "MLXCEL_NO_CPU_KERNELS" in library.reason
    assert list(tmp_path.iterdir()) == []


@can_build
def test_a_missing_compiler_leaves_the_kernels_out(tmp_path):
    library = load_native_library({"CC": "no-such-cc", "MLXCEL_CACHE_DIR": str(tmp_path)})
    assert library.library is None
    assert library.reason == "no C compiler (no-such-cc) found"


@can_build
def test_a_compiler_named_with_arguments_builds(tmp_path):
    library = load_native_library({"CC": "cc -Wall", "MLXCEL_CACHE_DIR": str(tmp_path)})
    assert library.library is not None, library.reason


@can_build
def test_a_cache_that_cannot_be_written_leaves_the_kernels_out_without_raising(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    library = load_native_library({"MLXCEL_CACHE_DIR": str(blocker)})
    assert library.library is None
    assert library.reason.startswith("build failed: ")


@can_build
def test_a_failed_build_is_remembered_and_leaves_no_library_behind(tmp_path, monkeypatch):
    source = tmp_path / "broken.c"
    source.write_text("int f(void) { return }\n")
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path / "cache")}
    first = load_native_library(environ, sources=(source,))
    assert first.library is None and first.reason.startswith("build failed: ")
    (remembered,) = cache_directory(environ).iterdir()
    assert remembered.name.endswith(native.FAILED_SUFFIX)

    def no_second_build(*args):
        raise AssertionError("the failed build ran again")

    monkeypatch.setattr(native, "_build", no_second_build)
    assert load_native_library(environ, sources=(source,)).reason == first.reason


@can_build
def test_the_library_is_built_once_then_loaded_and_rebuilt_when_damaged(tmp_path):
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path)}
    first = load_native_library(environ)
    assert first.library is not None, first.reason
    (built,) = cache_directory(environ).iterdir()
    assert built.name.startswith(LIBRARY_STEM) and built.suffix == ".so"
    stamp = built.stat().st_mtime_ns
    assert load_native_library(environ).library is not None
    assert list(cache_directory(environ).iterdir()) == [built]
    assert built.stat().st_mtime_ns == stamp
    built.write_bytes(b"cut short")
    # A process that has loaded a library gets it again by path: a new one reads the file.
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_IN_A_NEW_PROCESS, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.startswith("built with "), loaded.stdout + loaded.stderr
    assert built.stat().st_size > len(b"cut short")


@can_build
def test_every_kernel_source_goes_into_one_library_named_after_all_of_them(tmp_path):
    assert {source.name for source in SOURCES} >= {
        "dense_matvec.c",
        "paged_attention.c",
        "quantized_matvec.c",
        "swiglu.c",
    }
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path / "cache")}
    library = load_native_library(environ).library
    assert library is not None
    assert library.mlxcel_quantized_matvec and library.mlxcel_swiglu
    assert library.mlxcel_dense_matvec and library.mlxcel_paged_decode_attention
    (header,) = SOURCES[0].parent.glob("*.h")
    (tmp_path / header.name).write_bytes(header.read_bytes())
    copies = [tmp_path / source.name for source in SOURCES]
    for source, copy in zip(SOURCES, copies, strict=True):
        copy.write_bytes(source.read_bytes())
    assert load_native_library(environ, sources=copies).library is not None
    copies[-1].write_bytes(copies[-1].read_bytes() + b"\n")
    assert load_native_library(environ, sources=copies).library is not None
    assert len(list(cache_directory(environ).iterdir())) == 2
    # A change to the header the sources include makes another library too.
    (tmp_path / header.name).write_bytes(header.read_bytes() + b"\n")
    assert load_native_library(environ, sources=copies).library is not None
    assert len(list(cache_directory(environ).iterdir())) == 3


LOAD_IN_A_NEW_PROCESS = """
import sys
from mlxcel_core.kernels.cpu_matvec.native import load_native_library
print(load_native_library({"MLXCEL_CACHE_DIR": sys.argv[1]}).reason)
"""
