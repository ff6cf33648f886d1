"""The CPU kernels' C library: built once per machine with the system's C compiler, for
the machine's own instruction set (`-march=native`), kept in a cache and loaded with
ctypes.

MLX has no way to add a CPU kernel from Python, and its wheels cannot carry code compiled
for each CPU, so the library is built where it runs, as MLX builds its own fused CPU
kernels. Where there is no compiler, the CPU is not x86-64, the build fails or
`MLXCEL_NO_CPU_KERNELS=1` is set, nothing is built and callers keep MLX's products;
`NativeLibrary.reason` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NO_CPU_KERNELS_VARIABLE = "MLXCEL_NO_CPU_KERNELS"
SOURCE = Path(__file__).with_name("quantized_matvec.c")
FLAGS = ("-O3", "-march=native", "-std=c11", "-shared", "-fPIC", "-pthread")
BUILD_TIMEOUT_SECONDS = 120
X86_64 = frozenset({"x86_64", "AMD64", "amd64"})


@dataclass(frozen=True)
class NativeLibrary:
    """The loaded library, or None and the reason it is not in use."""

    library: ctypes.CDLL | None
    reason: str


def cache_directory(environ: Mapping[str, str] = os.environ) -> Path:
    """Where built libraries are kept: `$XDG_CACHE_HOME/mlxcel/kernels`, by default
    `~/.cache/mlxcel/kernels`."""
    cache_home = Path(environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    return cache_home / "mlxcel" / "kernels"


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags, which `-march=native` compiles for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    return "\n".join(next((line for line in lines if line.startswith(key)), "") for key in wanted)


def _library_name(compiler: str, source: bytes) -> str:
    identity = "\0".join((compiler, " ".join(FLAGS), _cpu_identity()))
    digest = hashlib.sha256(source + identity.encode()).hexdigest()[:20]
    return f"{SOURCE.stem}-{digest}.so"


def _build(compiler: str, source: Path, target: Path) -> str | None:
    """Compile `source` into `target` (atomically: concurrent processes may build the same
    library); None, or the compiler's first line of complaint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(handle)
    try:
        result = subprocess.run(
            [compiler, *FLAGS, "-o", partial, str(source)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
        )
        if result.returncode != 0:
            complaint = (result.stderr.strip() or result.stdout.strip()).splitlines()
            return complaint[0] if complaint else f"{compiler} exited {result.returncode}"
        os.replace(partial, target)
        return None
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{compiler}: {error}"
    finally:
        Path(partial).unlink(missing_ok=True)


def load_native_library(
    environ: Mapping[str, str] = os.environ, source: Path = SOURCE
) -> NativeLibrary:
    """Build (once per machine, compiler and source) and load the CPU kernels' library.

    Args:
        environ: the process environment: `MLXCEL_NO_CPU_KERNELS` (anything but "" or "0")
            turns the kernels off, `CC` names the compiler (`cc` by default),
            `XDG_CACHE_HOME` moves the cache.
        source: the C source to build.

    Returns:
        The library, or None with the reason; never raises for a missing or failing
        compiler.
    """
    if environ.get(NO_CPU_KERNELS_VARIABLE, "") not in ("", "0"):
        return NativeLibrary(None, f"turned off by {NO_CPU_KERNELS_VARIABLE}")
    if platform.machine() not in X86_64:
        return NativeLibrary(None, f"no kernels for {platform.machine()} CPUs")
    compiler = shutil.which(environ.get("CC") or "cc")
    if compiler is None:
        return NativeLibrary(None, f"no C compiler ({environ.get('CC') or 'cc'}) found")
    target = cache_directory(environ) / _library_name(compiler, source.read_bytes())
    if not target.exists():
        complaint = _build(compiler, source, target)
        if complaint is not None:
            return NativeLibrary(None, f"build failed: {complaint}")
    try:
        return NativeLibrary(ctypes.CDLL(str(target)), f"built with {compiler}")
    except OSError as error:
        return NativeLibrary(None, f"could not load {target}: {error}")


@functools.cache
def native_library() -> NativeLibrary:
    """This process's `load_native_library()`, built or loaded once."""
    return load_native_library()
