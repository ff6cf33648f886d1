"""Running `mlxcel` in-process for the flag tests: its exit code and stderr."""

import io

from mlxcel.cli import main


def run_mlxcel(argv: list[str], environ: dict[str, str] | None = None) -> tuple[int, str]:
    err = io.StringIO()
    code = main(argv, environ={} if environ is None else environ, out=io.StringIO(), err=err)
    return code, err.getvalue()
