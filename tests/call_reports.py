"""Each test's call report, kept on its item by conftest.py's `pytest_runtest_makereport`
hook, so that a fixture can act on a failure in its teardown (the browser tests save a
screenshot of the page). Needs nothing beyond pytest, so that conftest.py imports where
only the kernels' tests run (a GPU machine with MLX and numpy alone)."""

from __future__ import annotations

import pytest

CALL_REPORT = pytest.StashKey[pytest.TestReport]()
