"""`--stage-timeout` and its environment mirror: a value that is not a positive number of
seconds is refused in one line, before anything loads."""

from __future__ import annotations

import pytest
from cli_runs import run_mlxcel


@pytest.mark.parametrize(
    ("argv", "environ", "given"),
    [
        (["serve", "--stage-timeout", "0"], {}, "0.0"),
        (["serve"], {"MLXCEL_STAGE_TIMEOUT": "-1"}, "-1.0"),
    ],
)
def test_a_stage_timeout_that_is_not_positive_is_refused(argv, environ, given):
    code, err = run_mlxcel(argv, environ)
    assert code == 2
    assert err == f"mlxcel: error: --stage-timeout must be > 0 seconds, got {given}\n"
