"""`--stage-timeout` and its environment mirror: a value that is not a positive number of
seconds is refused in one line, before anything loads."""

from __future__ import annotations

import io

import pytest

from mlxcel.cli import main


@pytest.mark.parametrize(
    ("argv", "environ", "given"),
    [
        (["serve", "--stage-timeout", "0"], {}, "0.0"),
        (["serve"], {"MLXCEL_STAGE_TIMEOUT": "-1"}, "-1.0"),
    ],
)
def test_a_stage_timeout_that_is_not_positive_is_refused(argv, environ, given):
    err = io.StringIO()
    code = main(argv, environ=environ, out=io.StringIO(), err=err)
    assert code == 2
    assert err.getvalue() == f"mlxcel: error: --stage-timeout must be > 0 seconds, got {given}\n"
