"""`--stage-timeout` and its environment mirror: a value that is not a positive number of
seconds is refused in one line, before anything loads."""

from __future__ import annotations

import pytest
from cli_runs import run_mlxcel


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["serve", "--stage-timeout", "0"], {}, "--stage-timeout must be > 0 seconds, got 0.0"),
        # From the environment, the variable is named.
        (
            ["serve"],
            {"MLXCEL_STAGE_TIMEOUT": "-1"},
            "MLXCEL_STAGE_TIMEOUT must be > 0 seconds, got -1.0",
        ),
    ],
)
def test_a_stage_timeout_that_is_not_positive_is_refused(argv, environ, message):
    code, err = run_mlxcel(argv, environ)
    assert code == 2
    assert err == f"mlxcel: error: {message}\n"
