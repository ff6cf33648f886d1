"""`python -m mlxcel`, the same as the `mlxcel` command."""

from mlxcel.console import run

run()
