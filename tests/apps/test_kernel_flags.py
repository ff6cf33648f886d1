"""`--metal-kernels` / `MLXCEL_METAL_KERNELS`: parsed as a switch by the commands that run
a model, and installed for the kernels' callers."""

from __future__ import annotations

import argparse

import pytest

from mlxcel.cli import make_parser
from mlxcel.common.flags import UsageError, resolve_defaults
from mlxcel.common.kernel_flags import METAL_KERNELS_FLAG, apply_kernel_flags
from mlxcel_core.kernels import KernelOptions, install_kernel_options, installed_kernel_options


@pytest.fixture(autouse=True)
def reset_kernel_options():
    yield
    install_kernel_options(KernelOptions())


def resolved(environ: dict[str, str], argv: list[str] | None = None) -> argparse.Namespace:
    args = make_parser("bench").parse_args(["bench", *(argv or [])])
    resolve_defaults(args, [METAL_KERNELS_FLAG], environ)
    return args


@pytest.mark.parametrize(
    ("environ", "argv", "expected"),
    [
        ({}, [], False),
        ({"MLXCEL_METAL_KERNELS": "1"}, [], True),
        ({"MLXCEL_METAL_KERNELS": "0"}, [], False),
        ({}, ["--metal-kernels"], True),
    ],
)
def test_the_setting_reaches_the_kernels(environ, argv, expected):
    apply_kernel_flags(resolved(environ, argv))
    assert installed_kernel_options() == KernelOptions(metal_kernels=expected)


def test_a_value_that_is_no_switch_is_refused_naming_the_variable():
    with pytest.raises(UsageError, match="MLXCEL_METAL_KERNELS: invalid value 'maybe'"):
        resolved({"MLXCEL_METAL_KERNELS": "maybe"})


@pytest.mark.parametrize("command", ["generate", "run", "serve", "bench"])
def test_every_command_that_runs_a_model_takes_the_flag(command):
    args = make_parser(command).parse_args([command, "--metal-kernels"])
    assert args.metal_kernels is True
