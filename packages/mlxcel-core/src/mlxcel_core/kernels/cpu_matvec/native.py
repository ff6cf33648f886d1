"""The CPU kernels' C library: built once per machine with the system's C compiler, for
the machine's own instruction set (`-march=native`), kept in mlxcel's cache and loaded with
ctypes.

MLX has no way to add a CPU kernel from Python, and its wheels cannot carry code compiled
for each CPU, so the library is built where it runs, as MLX builds its own fused CPU
kernels. Where there is no compiler, the CPU is not x86-64, the build fails, the cache
cannot be written or `MLXCEL_NO_CPU_KERNELS=1` is set, callers keep MLX's products and
`NativeLibrary.reason` says why. A failed build is remembered beside the library it would
have made, so later processes do not pay for it again.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcel_core.cache_dir import mlxcel_cache_dir

NO_CPU_KERNELS_VARIABLE = "MLXCEL_NO_CPU_KERNELS"
# Every C source beside this file goes into the one library (the library's name also hashes
# the headers beside them).
SOURCES = tuple(sorted(Path(__file__).parent.glob("*.c")))
LIBRARY_STEM = "cpu_kernels"
FLAGS = ("-O3", "-march=native", "-std=c11", "-shared", "-fPIC", "-pthread")
BUILD_TIMEOUT_SECONDS = 120
X86_64 = frozenset({"x86_64", "AMD64", "amd64"})
FAILED_SUFFIX = ".failed"


@dataclass(frozen=True)
class NativeLibrary:
    """The loaded library, or None and the reason it is not in use."""

    library: ctypes.CDLL | None
    reason: str


def cache_directory(environ: Mapping[str, str] = os.environ) -> Path:
    """Where built libraries are kept: `${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}/kernels`."""
    return mlxcel_cache_dir(environ) / "kernels"


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags, which `-march=native` compiles for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(next((line for line in lines if line.startswith(key)), "") for key in wanted)


def _headers(sources: Sequence[Path]) -> list[Path]:
    """The C headers beside `sources`, which they may include."""
    return sorted({header for source in sources for header in source.parent.glob("*.h")})


def _library_name(command: list[str], sources: Sequence[Path]) -> str:
    digest = hashlib.sha256("\0".join((*command, *FLAGS, _cpu_identity())).encode())
    for source in (*sources, *_headers(sources)):
        digest.update(f"\0{source.name}\0".encode() + source.read_bytes())
    return f"{LIBRARY_STEM}-{digest.hexdigest()[:20]}.so"


def _build(command: list[str], sources: Sequence[Path], target: Path) -> str | None:
    """Compile `sources` into one library `target` (atomically: concurrent processes may
    build the same library); None, or why not: the compiler's first line of complaint, or
    the error that kept the cache from being written."""
    partial = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(suffix=".so.partial", dir=target.parent)
        os.close(handle)
        result = subprocess.run(
            [*command, *FLAGS, "-o", partial, *map(str, sources)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
        )
        if result.returncode != 0:
            complaint = (result.stderr.strip() or result.stdout.strip()).splitlines()
            return complaint[0] if complaint else f"{command[0]} exited {result.returncode}"
        os.replace(partial, target)
        return None
    except subprocess.TimeoutExpired:
        return f"{command[0]} took over {BUILD_TIMEOUT_SECONDS} s"
    except OSError as error:
        return f"{error.strerror or error}: {error.filename or target.parent}"
    finally:
        if partial is not None:
            Path(partial).unlink(missing_ok=True)


def _remember_failure(target: Path, reason: str) -> None:
    # A cache that cannot be written is tried again next time.
    with contextlib.suppress(OSError):
        target.with_name(target.name + FAILED_SUFFIX).write_text(reason + "\n")


def _compiler(environ: Mapping[str, str]) -> list[str] | str:
    """The compiler's command line (`CC`, which may carry arguments, else `cc`), or why
    there is none."""
    named = environ.get("CC") or "cc"
    try:
        words = shlex.split(named)
    except ValueError:
        words = []
    found = shutil.which(words[0]) if words else None
    if found is None:
        return f"no C compiler ({named}) found"
    return [found, *words[1:]]


def load_native_library(
    environ: Mapping[str, str] = os.environ, sources: Sequence[Path] = SOURCES
) -> NativeLibrary:
    """Build (once per machine, compiler and sources) and load the CPU kernels' library.

    Args:
        environ: the process environment: `MLXCEL_NO_CPU_KERNELS` (anything but "" or "0")
            turns the kernels off, `CC` names the compiler (`cc` by default; arguments
            allowed), `MLXCEL_CACHE_DIR` moves the cache.
        sources: the C sources built into the library.

    Returns:
        The library, or None with the reason. Never raises: a missing or failing compiler,
        a cache that cannot be written or a library that cannot be loaded each leave the
        kernels out.
    """
    if environ.get(NO_CPU_KERNELS_VARIABLE, "") not in ("", "0"):
        return NativeLibrary(None, f"turned off by {NO_CPU_KERNELS_VARIABLE}")
    if platform.machine() not in X86_64:
        return NativeLibrary(None, f"no kernels for {platform.machine()} CPUs")
    command = _compiler(environ)
    if isinstance(command, str):
        return NativeLibrary(None, command)
    try:
        target = cache_directory(environ) / _library_name(command, sources)
    except OSError as error:
        return NativeLibrary(None, f"could not read the kernels' sources: {error}")
    failed = target.with_name(target.name + FAILED_SUFFIX)
    if failed.exists():
        return NativeLibrary(None, f"build failed: {failed.read_text().strip()}")
    for _ in range(2):
        if not target.exists():
            complaint = _build(command, sources, target)
            if complaint is not None:
                _remember_failure(target, complaint)
                return NativeLibrary(None, f"build failed: {complaint}")
        try:
            return NativeLibrary(ctypes.CDLL(str(target)), f"built with {command[0]}")
        except OSError as error:
            reason = f"could not load {target}: {error}"
            # A damaged library (a disk that filled, a copy cut short) is built once more.
            with contextlib.suppress(OSError):
                target.unlink(missing_ok=True)
    return NativeLibrary(None, reason)


def c_buffer(array: mx.array) -> tuple[int, np.ndarray]:
    """A C pointer to `array`'s values in row-major order, and the NumPy buffer that holds
    them (a view of MLX's memory where it is already contiguous), to keep while C reads.
    `array` must be evaluated."""
    held = np.ascontiguousarray(array)
    return held.ctypes.data, held


def describe_kernel(mlx_operation: str) -> str:
    """Which runs an operation the library has a kernel for: "mlxcel's AVX2 kernel" or
    `mlx_operation`, with the reason (how it was built, or why it is not in use)."""
    library = native_library()
    where = "mlxcel's AVX2 kernel" if library.library is not None else mlx_operation
    return f"{where} ({library.reason})"


@functools.cache
def native_library() -> NativeLibrary:
    """This process's `load_native_library()`, built or loaded once."""
    return load_native_library()


@functools.cache
def entry_point(name: str, *argument_types: type) -> ctypes._CFuncPtr:
    """The library's C function `name`, which returns an int status, with its arguments'
    types declared once.

    Raises:
        ValueError: the library is not available (see `NativeLibrary.reason`).
    """
    library = native_library()
    if library.library is None:
        raise ValueError(f"the CPU kernels are not available: {library.reason}")
    function = getattr(library.library, name)
    function.restype = ctypes.c_int
    function.argtypes = list(argument_types)
    return function
