"""Which BLAS `mlxcel` preloads: from PyPI, from the system, none, or turned off."""

import ctypes.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcel.common.blas import (
    FORTRAN_RUNTIME,
    NO_OPENBLAS_VARIABLE,
    BlasPreload,
    BlasSource,
    link_fortran_runtime,
    mlx_cpu_libraries,
    pypi_openblas_library,
    select_blas,
)
from mlxcel.common.blas_threads import process_threads

LINUX_X86_64 = sys.platform.startswith("linux") and platform.machine() == "x86_64"


@pytest.fixture
def libraries(tmp_path):
    """Fake library files: the PyPI package's, two system locations (the second present),
    and a Fortran runtime directory."""
    pypi = tmp_path / "site-packages" / "ngsolve_openblas" / "libopenblasp-r0.3.33.so"
    missing_system = tmp_path / "usr" / "aarch64" / "libblas.so.3"
    system = tmp_path / "usr" / "x86_64" / "libblas.so.3"
    for path in (pypi, system):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"\x7fELF")
    return pypi, (missing_system, system), (tmp_path / "links",)


def test_the_pypi_openblas_comes_first_with_its_fortran_runtime(libraries):
    pypi, system, fortran = libraries
    chosen = select_blas({}, pypi_library=pypi, fortran_dirs=fortran, system_libraries=system)
    assert chosen == BlasPreload(BlasSource.PYPI, pypi, fortran)
    # The system's own Fortran runtime needs no directory.
    chosen = select_blas({}, pypi_library=pypi, fortran_dirs=(), system_libraries=system)
    assert chosen == BlasPreload(BlasSource.PYPI, pypi, ())


def test_the_systems_openblas_when_the_pypi_one_is_absent_or_cannot_load(libraries):
    pypi, system, fortran = libraries
    expected = BlasPreload(BlasSource.SYSTEM, system[1])
    assert select_blas({}, pypi_library=None, fortran_dirs=None, system_libraries=system) == (
        expected
    )
    # Installed, but with no Fortran runtime to load it with.
    assert select_blas({}, pypi_library=pypi, fortran_dirs=None, system_libraries=system) == (
        expected
    )
    gone = pypi.with_name("libopenblas-gone.so")
    assert select_blas({}, pypi_library=gone, fortran_dirs=fortran, system_libraries=system) == (
        expected
    )


def test_no_openblas_at_all_leaves_mlxs_own(libraries):
    _, system, _ = libraries
    chosen = select_blas({}, pypi_library=None, fortran_dirs=None, system_libraries=system[:1])
    assert chosen == BlasPreload(BlasSource.NONE)
    assert chosen.environment({"LD_PRELOAD": "x.so"}) == {"LD_PRELOAD": "x.so"}


def test_mlxcel_no_openblas_turns_it_off_and_zero_does_not(libraries):
    pypi, system, fortran = libraries
    kwargs = {"pypi_library": pypi, "fortran_dirs": fortran, "system_libraries": system}
    assert select_blas({NO_OPENBLAS_VARIABLE: "1"}, **kwargs) == BlasPreload(BlasSource.OFF)
    assert select_blas({NO_OPENBLAS_VARIABLE: "0"}, **kwargs).source is BlasSource.PYPI


def test_the_preload_goes_first_and_is_recognised_once_there(libraries):
    pypi, _, fortran = libraries
    chosen = BlasPreload(BlasSource.PYPI, pypi, fortran)
    environment = chosen.environment({"LD_PRELOAD": "a.so", "LD_LIBRARY_PATH": "/opt/lib"})
    assert environment["LD_PRELOAD"] == f"{pypi}:a.so"
    assert environment["LD_LIBRARY_PATH"] == f"{fortran[0]}:/opt/lib"
    assert chosen.environment({}) == {"LD_PRELOAD": str(pypi), "LD_LIBRARY_PATH": str(fortran[0])}
    assert chosen.is_preloaded(environment)
    assert not chosen.is_preloaded({"LD_PRELOAD": f"{pypi}.old"})


def test_the_fortran_runtime_link_is_made_once_and_refused_where_it_cannot_be(tmp_path):
    libs = tmp_path / "mlx_cpu.libs"
    libs.mkdir()
    links = tmp_path / "cache" / "blas-runtime"
    assert link_fortran_runtime(libs, links) is None  # no runtime to link
    runtime = libs / "libgfortran-f7379c93.so.5.0.0"
    runtime.write_bytes(b"\x7fELF")
    assert link_fortran_runtime(libs, links) == (links, libs)
    assert (links / FORTRAN_RUNTIME).resolve() == runtime.resolve()
    assert link_fortran_runtime(libs, links) == (links, libs)
    assert sorted(p.name for p in links.iterdir()) == [FORTRAN_RUNTIME]
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert link_fortran_runtime(libs, blocked / "blas-runtime") is None


def run_python(code: str, environ: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(not LINUX_X86_64, reason="ngsolve-openblas ships Linux x86-64 wheels only")
def test_the_pypi_openblas_loads_with_mlx_cpus_fortran_runtime_and_serves_mlx(tmp_path):
    library = pypi_openblas_library()
    libs = mlx_cpu_libraries()
    assert library is not None and libs is not None  # both are dependencies of mlxcel[cpu]
    fortran = link_fortran_runtime(libs, tmp_path / "links")
    assert fortran is not None
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    environ = BlasPreload(BlasSource.PYPI, library, fortran).environment(clean)
    # LD_LIBRARY_PATH comes before the system's libraries, so the link is what loads.
    out = run_python(
        "import mlx.core as mx; from pathlib import Path;"
        "from mlxcel.common.blas import loaded_openblas;"
        "maps = Path('/proc/self/maps').read_text();"
        "print(loaded_openblas()[0]);"
        "print(next(l.split()[-1] for l in maps.splitlines() if 'gfortran' in l));"
        "a = mx.ones((64, 64)); print((a @ a)[0, 0].item())",
        environ,
    )
    version, fortran_file, product = out.split("\n")[:3]
    assert version.startswith("OpenBLAS 0.3.")
    assert Path(fortran_file).parent == libs
    assert float(product) == 64.0


@pytest.mark.skipif(not LINUX_X86_64, reason="ngsolve-openblas ships Linux x86-64 wheels only")
def test_mlxcel_version_names_the_blas_it_runs_with_and_its_threads():
    unset = ("LD_PRELOAD", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    clean = {k: v for k, v in os.environ.items() if k not in unset}
    command = [sys.executable, "-m", "mlxcel", "--version"]
    run = subprocess.run(command, capture_output=True, text=True, env=clean, timeout=60)
    assert run.returncode == 0, run.stderr
    line = run.stdout.splitlines()[1]
    assert "from PyPI (ngsolve-openblas)" in line
    assert line.endswith(f"; threads: {process_threads()}")
    run = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**clean, "OPENBLAS_NUM_THREADS": "2"},
        timeout=60,
    )
    assert run.stdout.splitlines()[1].endswith("; threads: 2")
    off = {**clean, NO_OPENBLAS_VARIABLE: "1"}
    run = subprocess.run(command, capture_output=True, text=True, env=off, timeout=60)
    assert run.stdout.splitlines()[1] == f"BLAS: {BlasSource.OFF}"


@pytest.mark.skipif(not LINUX_X86_64, reason="ngsolve-openblas ships Linux x86-64 wheels only")
@pytest.mark.skipif(
    ctypes.util.find_library("gfortran") is not None,
    reason="the system's Fortran runtime needs no link in the cache",
)
def test_a_cache_that_cannot_hold_the_runtime_link_is_named_as_the_reason(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unset = ("LD_PRELOAD", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    environ["MLXCEL_CACHE_DIR"] = str(blocked / "cache")
    run = subprocess.run(
        [sys.executable, "-m", "mlxcel", "--version"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    line = run.stdout.splitlines()[1]
    assert "ngsolve-openblas is installed, but its Fortran runtime could not be linked" in line
    assert str(blocked / "cache" / "blas-runtime") in line


def test_the_ci_scripts_blas_environment_runs_and_sets_the_threads():
    # .ci/run gives the test process the BLAS the command would preload; its snippet names
    # mlxcel's modules, so a module moved without it would leave CI without OpenBLAS.
    script = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    snippet = script.split("blas_environment=\"$(.venv/bin/python -c '", 1)[1].split("')\"", 1)[0]
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    result = subprocess.run(
        [sys.executable, "-c", snippet], env=environ, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert f"export OPENBLAS_NUM_THREADS={process_threads()}" in result.stdout.splitlines()
