"""Which BLAS the `mlxcel` command preloads on Linux, and which one a process runs with.

MLX's Linux CPU wheel links a reference BLAS, about 30-60x slower at float32 matrix
products than OpenBLAS. MLX calls the standard `cblas_sgemm`, so an OpenBLAS preloaded
with `LD_PRELOAD` takes its place (docs/adr/0003). In order of preference:

1. OpenBLAS from PyPI: `ngsolve-openblas`, a dependency of the Linux x86-64 CPU install
   (`mlxcel[cpu]`), built for every x86-64 core and exporting the unprefixed `cblas_*`
   symbols (docs/adr/0028 compares the packages). It needs the Fortran runtime
   `libgfortran.so.5`, which `mlx-cpu`'s wheel ships under a hashed name in `mlx_cpu.libs`:
   a directory of links gives it its standard name on `LD_LIBRARY_PATH`.
2. The system's: Debian's and Ubuntu's `libopenblas0-pthread`.
3. None: MLX's reference BLAS.

`MLXCEL_NO_OPENBLAS=1` turns the preload off. This module imports the standard library
only: it runs before MLX is imported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

NO_OPENBLAS_VARIABLE = "MLXCEL_NO_OPENBLAS"
PYPI_PACKAGE = "ngsolve-openblas"
_PYPI_MODULE = "ngsolve_openblas"
# Debian's and Ubuntu's libopenblas0-pthread.
SYSTEM_LIBRARIES = (
    Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"),
    Path("/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3"),
)
FORTRAN_RUNTIME = "libgfortran.so.5"
# Where the link giving mlx-cpu's Fortran runtime its standard name is kept.
RUNTIME_LINKS_DIR = "blas-runtime"


class BlasSource(StrEnum):
    """Where the BLAS a process runs with comes from."""

    PYPI = "OpenBLAS from PyPI"
    SYSTEM = "the system's OpenBLAS"
    NONE = "MLX's reference BLAS"
    OFF = f"MLX's reference BLAS ({NO_OPENBLAS_VARIABLE} is set)"


@dataclass(frozen=True)
class BlasPreload:
    """The BLAS to preload.

    Attributes:
        source: where it comes from.
        library: the shared library to preload; None for MLX's own.
        library_dirs: directories the library's dependencies are found in, which go first
            on `LD_LIBRARY_PATH`.
    """

    source: BlasSource
    library: Path | None = None
    library_dirs: tuple[Path, ...] = ()

    def environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`environ` with the library first in `LD_PRELOAD` and its directories first on
        `LD_LIBRARY_PATH`; unchanged without a library."""
        if self.library is None:
            return dict(environ)
        updated = dict(environ)
        updated["LD_PRELOAD"] = _prepend([str(self.library)], environ.get("LD_PRELOAD", ""))
        if self.library_dirs:
            dirs = [str(directory) for directory in self.library_dirs]
            updated["LD_LIBRARY_PATH"] = _prepend(dirs, environ.get("LD_LIBRARY_PATH", ""))
        return updated

    def is_preloaded(self, environ: Mapping[str, str]) -> bool:
        """Whether `environ`'s `LD_PRELOAD` already holds the library."""
        preload = environ.get("LD_PRELOAD", "").replace(" ", ":").split(":")
        return self.library is not None and str(self.library) in preload


def is_turned_off(environ: Mapping[str, str]) -> bool:
    """Whether `MLXCEL_NO_OPENBLAS` is set to anything but "" or "0"."""
    return environ.get(NO_OPENBLAS_VARIABLE, "") not in ("", "0")


def _prepend(items: list[str], existing: str) -> str:
    return ":".join([*items, existing]) if existing else ":".join(items)


def select_blas(
    environ: Mapping[str, str],
    *,
    pypi_library: Path | None,
    fortran_dirs: tuple[Path, ...] | None,
    system_libraries: Sequence[Path] = SYSTEM_LIBRARIES,
) -> BlasPreload:
    """The BLAS to preload, in the module's order of preference.

    Args:
        environ: the process environment (`MLXCEL_NO_OPENBLAS` turns the preload off).
        pypi_library: the PyPI package's OpenBLAS library, None when not installed.
        fortran_dirs: directories that give the PyPI library its Fortran runtime (empty
            when the system has one); None when it cannot have one, which rules it out.
        system_libraries: the system's OpenBLAS libraries, the first existing one taken.
    """
    if is_turned_off(environ):
        return BlasPreload(BlasSource.OFF)
    if pypi_library is not None and pypi_library.is_file() and fortran_dirs is not None:
        return BlasPreload(BlasSource.PYPI, pypi_library, fortran_dirs)
    system = next((path for path in system_libraries if path.is_file()), None)
    if system is not None:
        return BlasPreload(BlasSource.SYSTEM, system)
    return BlasPreload(BlasSource.NONE)


def pypi_openblas_library() -> Path | None:
    """The OpenBLAS library of the installed `ngsolve-openblas`, found without importing
    the package (its `__init__` loads the library into the calling process)."""
    spec = importlib.util.find_spec(_PYPI_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    return next(iter(sorted(package.glob("libopenblas*.so*"))), None)


def mlx_cpu_libraries() -> Path | None:
    """mlx-cpu's folder of bundled libraries (`mlx_cpu.libs` beside `mlx`), if installed."""
    spec = importlib.util.find_spec("mlx")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "mlx_cpu.libs"
    return libs if libs.is_dir() else None


def link_fortran_runtime(libs: Path, links: Path) -> tuple[Path, ...] | None:
    """Give the Fortran runtime bundled in `libs` its standard name: a link
    `links/libgfortran.so.5` to it. Returns the directories to put on `LD_LIBRARY_PATH`
    (`links`, then `libs`, where the runtime's own dependencies are), or None when `libs`
    holds no runtime or the link cannot be made."""
    runtime = next(iter(sorted(libs.glob("libgfortran-*.so.5*"))), None)
    if runtime is None:
        return None
    link = links / FORTRAN_RUNTIME
    try:
        links.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink() or link.resolve() != runtime.resolve():
            temporary = links / f".{FORTRAN_RUNTIME}.{os.getpid()}"
            temporary.unlink(missing_ok=True)
            temporary.symlink_to(runtime)
            temporary.replace(link)  # atomic: a concurrent start never finds no link
    except OSError:
        return None
    return (links, libs)


def fortran_runtime_dirs(cache_dir: Path) -> tuple[Path, ...] | None:
    """Directories that give a preloaded OpenBLAS its `libgfortran.so.5`: none needed when
    the system has one, else mlx-cpu's linked under `cache_dir` (`link_fortran_runtime`);
    None when neither can be had."""
    if ctypes.util.find_library("gfortran") is not None:
        return ()
    libs = mlx_cpu_libraries()
    if libs is None:
        return None
    return link_fortran_runtime(libs, cache_dir / RUNTIME_LINKS_DIR)


def cache_dir(environ: Mapping[str, str]) -> Path:
    """`${MLXCEL_CACHE_DIR:-~/.cache/mlxcel}`."""
    return Path(environ.get("MLXCEL_CACHE_DIR") or "~/.cache/mlxcel").expanduser()


def preferred_blas(environ: Mapping[str, str]) -> BlasPreload:
    """`select_blas` over what this machine has installed."""
    if is_turned_off(environ):
        return BlasPreload(BlasSource.OFF)
    pypi = pypi_openblas_library()
    fortran = None if pypi is None else fortran_runtime_dirs(cache_dir(environ))
    return select_blas(environ, pypi_library=pypi, fortran_dirs=fortran)


class _DlInfo(ctypes.Structure):
    _fields_ = (
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    )


def loaded_openblas() -> tuple[str, Path | None] | None:
    """The OpenBLAS this process runs with, as (its version, e.g. "OpenBLAS 0.3.33", the
    file that defines it if known), or None when none is loaded."""
    process = ctypes.CDLL(None)
    try:
        get_config = process.openblas_get_config
    except AttributeError:
        return None
    get_config.restype = ctypes.c_char_p
    version = " ".join(get_config().decode(errors="replace").split()[:2])
    info = _DlInfo()
    found = process.dladdr(ctypes.cast(get_config, ctypes.c_void_p), ctypes.byref(info))
    path = Path(os.fsdecode(info.dli_fname)) if found and info.dli_fname else None
    return version, path


def describe_blas(environ: Mapping[str, str]) -> str:
    """One line saying which BLAS this process runs with, where it comes from and, for
    OpenBLAS, its threads."""
    loaded = loaded_openblas()
    if loaded is None:
        if is_turned_off(environ):
            return f"BLAS: {BlasSource.OFF}"
        links = cache_dir(environ) / RUNTIME_LINKS_DIR
        if pypi_openblas_library() is not None and fortran_runtime_dirs(links.parent) is None:
            return (
                f"BLAS: {BlasSource.NONE} ({PYPI_PACKAGE} is installed, but its Fortran "
                f"runtime could not be linked in {links}: MLXCEL_CACHE_DIR must name a "
                "writable folder)"
            )
        return (
            f"BLAS: {BlasSource.NONE} (no OpenBLAS preloaded: pip install "
            f"{PYPI_PACKAGE}, or apt-get install libopenblas0-pthread)"
        )
    version, path = loaded
    pypi = pypi_openblas_library()
    if path is not None and pypi is not None and path.resolve() == pypi.resolve():
        where = f"from PyPI ({PYPI_PACKAGE})"
    elif path is not None and path.resolve() in {p.resolve() for p in SYSTEM_LIBRARIES}:
        where = "the system's"
    else:
        where = "preloaded"
    threads = ctypes.CDLL(None).openblas_get_num_threads()
    return f"BLAS: {version}, {where}: {path or 'file unknown'}; threads: {threads}"
