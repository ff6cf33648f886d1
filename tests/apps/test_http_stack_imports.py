"""`mlxcel generate` and the ranks of `--tp`/`--pp`/`--disaggregate` start without the HTTP
stack (Quart, Hypercorn, pydantic): only `mlxcel serve` loads it."""

from __future__ import annotations

import subprocess
import sys

import pytest

HTTP_STACK = ("quart", "hypercorn", "pydantic", "pydantic_core")


def import_without_http_stack(statement: str) -> subprocess.CompletedProcess[str]:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in HTTP_STACK)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; {blocked}; {statement}"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_generate_command_and_the_rank_set_up_import_without_it():
    done = import_without_http_stack(
        "import mlxcel.generation.generate_command, mlxcel.distributed.parallel_flags, "
        "mlxcel.distributed.stage_faults, mlxcel.distributed.disaggregate_flags; "
        "from mlxcel_server import ServerState, ServerSettings"
    )
    assert done.returncode == 0, done.stderr


def test_the_app_still_needs_it_and_is_there_when_asked_for():
    done = import_without_http_stack("from mlxcel_server import create_app")
    assert done.returncode != 0 and "quart" in done.stderr
    from mlxcel_server import create_app

    assert callable(create_app)


def test_a_name_the_server_package_lacks_is_an_attribute_error():
    import mlxcel_server

    with pytest.raises(AttributeError, match="no attribute 'create_ap'"):
        _ = mlxcel_server.create_ap
