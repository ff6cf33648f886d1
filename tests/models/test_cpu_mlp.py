"""mlx-lm's SwiGLU MLPs with the CPU activation kernel: which MLPs take it, and a model
that does gives the logits and greedy tokens of one that does not."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import deepseek_v3, gemma, llama
from mlx_lm.models.activations import swiglu

from mlxcel_core.generate import generate_tokens
from mlxcel_core.kernels.cpu_matvec import swiglu as swiglu_kernel
from mlxcel_core.sampling import Sampler, SamplingParams
from mlxcel_models import cpu_mlp
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.cpu_mlp import KernelSwiGLU, is_swiglu_mlp
from mlxcel_models.cpu_ops import install_cpu_ops
from mlxcel_models.loading.loader import load_model

from cpu_kernels import needs_kernel
from factories import TinyConfig, write_gguf_model

DENSE = ComputeOptions(mx.float32, dense_weights_max_bytes=2**30)
GREEDY = SamplingParams(temperature=0.0)
CPU_OPS = ComputeOptions(mx.float32, dense_weights_max_bytes=2**30, cpu_ops=True, cpu_streams=2)


class Projections(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(8, 16, bias=False)
        self.up_proj = nn.Linear(8, 16, bias=False)
        self.down_proj = nn.Linear(16, 8, bias=False)


class NamedResultMLP(Projections):
    def __call__(self, x):
        out = self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
        return out


class InheritedMLP(llama.MLP):
    pass


class SiluTimesUpMLP(Projections):
    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class SwappedArgumentsMLP(Projections):
    def __call__(self, x):
        return self.down_proj(swiglu(self.up_proj(x), self.gate_proj(x)))


class ExtraArgumentMLP(Projections):
    def __call__(self, x, scale=1.0):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class ExtraArgumentsMLP(Projections):
    def __call__(self, x, **options):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def _with_other_swiglu() -> type[nn.Module]:
    """A class whose body reads exactly like mlx-lm's but whose `swiglu` is another
    function (as a family with a clamped activation of the same name would have)."""
    namespace = {"Projections": Projections, "swiglu": lambda gate, x: mx.clip(gate, -1, 1) * x}
    exec(
        "class OtherSwigluMLP(Projections):\n"
        "    def __call__(self, x):\n"
        "        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))\n",
        namespace,
    )
    return namespace["OtherSwigluMLP"]


def _llama_mlp(mlp_class: type[llama.MLP] = llama.MLP) -> llama.MLP:
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=8,
        num_hidden_layers=1,
        intermediate_size=16,
        num_attention_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=32,
    )
    return mlp_class(args)


def _deepseek_mlp() -> deepseek_v3.DeepseekV3MLP:
    # mlx-lm's DeepSeek MLPs name their result before returning it.
    args = deepseek_v3.ModelArgs(model_type="deepseek_v3", hidden_size=8, intermediate_size=16)
    return deepseek_v3.DeepseekV3MLP(args)


def test_the_mlps_that_compute_swiglu_of_gate_and_up_are_recognised():
    assert is_swiglu_mlp(_llama_mlp())
    assert is_swiglu_mlp(_deepseek_mlp())
    assert is_swiglu_mlp(NamedResultMLP())
    assert is_swiglu_mlp(_llama_mlp(InheritedMLP))


@pytest.mark.parametrize(
    "mlp_class",
    [
        SiluTimesUpMLP,
        SwappedArgumentsMLP,
        ExtraArgumentMLP,
        ExtraArgumentsMLP,
        _with_other_swiglu(),
    ],
)
def test_mlps_with_another_body_are_left_alone(mlp_class):
    mlp = mlp_class()
    assert not is_swiglu_mlp(mlp)
    assert install_cpu_ops(mlp) == 0
    assert type(mlp) is mlp_class


def test_mlps_without_the_three_layers_or_another_activation_are_left_alone():
    mlp = _llama_mlp()
    del mlp["up_proj"]
    assert not is_swiglu_mlp(mlp)
    assert not is_swiglu_mlp(gemma.MLP(8, 16))
    assert not is_swiglu_mlp(nn.Linear(4, 4))


@pytest.fixture
def kernel_at_any_size(monkeypatch):
    """The kernel for activations of any size, so tiny models take it."""
    monkeypatch.setattr(cpu_mlp, "KERNEL_MIN_ELEMENTS", 0)


@needs_kernel
def test_the_mlp_keeps_its_class_layers_and_attributes_and_uses_the_kernel(
    monkeypatch, kernel_at_any_size
):
    mlp = _deepseek_mlp()
    layers = {name: mlp[name] for name in ("gate_proj", "up_proj", "down_proj")}
    names = [name for name, _ in tree_flatten(mlp.parameters())]
    x = mx.random.normal((3, 8), key=mx.random.key(0))
    expected = mlp(x)
    assert install_cpu_ops(mlp, cpu_streams=2) == 1
    assert isinstance(mlp, deepseek_v3.DeepseekV3MLP) and isinstance(mlp, KernelSwiGLU)
    assert mlp.kernel_cpu_streams == 2 and mlp.intermediate_size == 16
    assert all(mlp[name] is layer for name, layer in layers.items())
    assert [name for name, _ in tree_flatten(mlp.parameters())] == names
    calls = []
    kernel = swiglu_kernel.cpu_swiglu

    def counted(gate, up, *, threads):
        calls.append((gate.shape, threads))
        return kernel(gate, up, threads=threads)

    monkeypatch.setattr(swiglu_kernel, "cpu_swiglu", counted)
    np.testing.assert_allclose(np.array(mlp(x)), np.array(expected), rtol=1e-5, atol=1e-6)
    assert calls == [((3, 16), 1)]
    assert install_cpu_ops(mlp) == 0  # already done


@needs_kernel
def test_inputs_the_kernel_does_not_take_go_through_mlx_swiglu(monkeypatch):
    mlp = _llama_mlp()
    mlp.set_dtype(mx.float16)
    x = mx.random.normal((2, 8), key=mx.random.key(1)).astype(mx.float16)
    expected = mlp(x)
    install_cpu_ops(mlp)
    monkeypatch.setattr(swiglu_kernel, "cpu_swiglu", None)  # must not be reached
    assert mx.array_equal(mlp(x), expected)


@needs_kernel
def test_activations_under_the_minimum_size_go_through_mlx_swiglu(monkeypatch):
    mlp = _llama_mlp()
    x = mx.random.normal((2, 8), key=mx.random.key(2))
    expected = mlp(x)
    install_cpu_ops(mlp)
    sizes = []
    kernel = swiglu_kernel.cpu_swiglu

    def counted(gate, up, *, threads):
        sizes.append(gate.size)
        return kernel(gate, up, threads=threads)

    monkeypatch.setattr(swiglu_kernel, "cpu_swiglu", counted)
    assert mx.array_equal(mlp(x), expected) and sizes == []
    values = x.shape[0] * mlp.gate_proj.weight.shape[0]
    monkeypatch.setattr(cpu_mlp, "KERNEL_MIN_ELEMENTS", values)
    np.testing.assert_allclose(np.array(mlp(x)), np.array(expected), rtol=1e-5, atol=1e-6)
    assert sizes == [values]


@needs_kernel
def test_a_model_with_the_kernel_gives_the_same_logits_and_greedy_tokens(
    tmp_path: Path, kernel_at_any_size
):
    path = write_gguf_model(tmp_path / "tiny.gguf", TinyConfig(num_layers=3))
    plain = load_model(path, compute=DENSE)
    fused = load_model(path, compute=CPU_OPS)
    mlps = [m for _, m in fused.model.module.named_modules() if isinstance(m, KernelSwiGLU)]
    assert len(mlps) == 3 and all(isinstance(m, llama.MLP) for m in mlps)
    tokens = mx.array([[5, 80, 81, 200, 17, 42, 9, 260]])
    expected = plain.model(tokens, plain.model.make_cache())
    actual = fused.model(tokens, fused.model.make_cache())
    np.testing.assert_allclose(np.array(actual), np.array(expected), rtol=1e-4, atol=1e-5)
    prompt = [5, 80, 81, 200, 17]
    greedy = [
        list(itertools.islice(generate_tokens(m.model, prompt, Sampler(GREEDY)), 16))
        for m in (plain, fused)
    ]
    assert greedy[0] == greedy[1]


def test_turned_off_by_the_environment_the_model_keeps_mlx_swiglu(tmp_path: Path):
    path = write_gguf_model(tmp_path / "tiny.gguf", TinyConfig(num_layers=2))
    environment = {**os.environ, "MLXCEL_NO_CPU_KERNELS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", COUNT_KERNEL_MLPS, str(path)],
        capture_output=True,
        text=True,
        env=environment,
        check=True,
    )
    assert result.stdout.split() == ["0", "2"], result.stderr


COUNT_KERNEL_MLPS = """
import sys
import mlx.core as mx
from mlx_lm.models.llama import MLP
from mlxcel_models import cpu_mlp
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.cpu_mlp import KernelSwiGLU
from mlxcel_models.loading.loader import load_model
options = ComputeOptions(mx.float32, dense_weights_max_bytes=2**30, cpu_ops=True)
layers = list(load_model(sys.argv[1], compute=options).model.module.modules())
print(sum(isinstance(m, KernelSwiGLU) for m in layers), sum(isinstance(m, MLP) for m in layers))
"""
