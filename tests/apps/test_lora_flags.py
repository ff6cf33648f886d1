"""`--lora`, `--lora-scaled`, `--lora-init-without-apply` and `--lora-fuse` through `main(argv)`,
on the tiny float32 llama, and a server that refuses to start on a bad adapter."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

from mlxcel.cli import main

from adapter_factories import lora_updates, write_mlx_lm_adapter
from live_server import free_port


def run_cli(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> str:
    return str(write_mlx_lm_adapter(tmp_path_factory.mktemp("lora") / "a", lora_updates(), 2.0))


@pytest.fixture(scope="module")
def wide_adapter(tmp_path_factory) -> str:
    updates = lora_updates()
    updates["model.layers.0.self_attn.q_proj.lora_a"] = np.zeros((65, 8), np.float32)
    return str(write_mlx_lm_adapter(tmp_path_factory.mktemp("lora") / "wide", updates, 1.0))


def generate(model, *flags: str, environ: dict[str, str] | None = None) -> str:
    code, out, err = run_cli(
        "generate", "-m", str(model), "-p", "hello", "-no-cnv", "--temp", "0", "-n", "8", *flags,
        environ=environ,
    )  # fmt: skip
    assert code == 0, err
    return out


def test_adapter_flags_change_the_output_and_scale_zero_restores_it(tiny_safetensors, adapter):
    base = generate(tiny_safetensors)
    adapted = generate(tiny_safetensors, "--lora", adapter)
    assert adapted != base
    assert generate(tiny_safetensors, "--lora-scaled", adapter, "0") == base
    assert generate(tiny_safetensors, "--lora", adapter, "--lora-init-without-apply") == base
    assert generate(tiny_safetensors, "--lora-scaled", adapter, "1.0", "--lora-fuse") == adapted
    environ = {"LLAMA_ARG_LORA_SCALED": f"{adapter} 1"}
    assert generate(tiny_safetensors, environ=environ) == adapted


def test_batch_generation_applies_the_adapters(tiny_safetensors, adapter, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nhello\n")
    argv = ["generate", "-m", str(tiny_safetensors), "--prompts-file", str(prompts), "-no-cnv"]
    argv += ["--temp", "0", "-n", "8", "--lora", adapter]
    code, out, err = run_cli(*argv)
    assert code == 0, err
    texts = [json.loads(line)["text"] for line in out.splitlines()]
    alone = generate(tiny_safetensors, "--lora", adapter).removesuffix("\n")
    assert texts == [alone, alone]


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (("--lora", "/no/such/adapter"), 1, "LoRA adapter /no/such/adapter: no such folder"),
        (("--lora-scaled", "x"), 2, "expected 2 arguments"),
        (("--lora-fuse",), 2, "--lora-fuse needs adapters"),
        (("--lora-init-without-apply",), 2, "--lora-init-without-apply needs adapters"),
    ],
)
def test_bad_adapter_flags_get_one_line_and_an_exit_code(tiny_safetensors, flags, code, message):
    got, _, err = run_cli("generate", "-m", str(tiny_safetensors), "-p", "hi", *flags)
    assert got == code
    assert err.startswith("mlxcel: error: ") and err.count("\n") == 1, err
    assert message in err


def test_an_adapter_that_does_not_fit_fails_naming_the_tensor(tiny_safetensors, wide_adapter):
    code, _, err = run_cli(
        "generate", "-m", str(tiny_safetensors), "-p", "hi", "--lora", wide_adapter
    )
    assert code == 1 and err.count("\n") == 1, err
    assert "model.layers.0.self_attn.q_proj.lora_a has shape (65, 8)" in err


def test_a_server_given_a_bad_adapter_does_not_start(tiny_safetensors, wide_adapter):
    command = [sys.executable, "-m", "mlxcel", "serve", "-m", str(tiny_safetensors)]
    command += ["--port", str(free_port()), "--lora", wide_adapter]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "q_proj.lora_a has shape (65, 8)" in done.stderr.splitlines()[-1]
