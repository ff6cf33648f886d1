"""The CPU forms of RoPE and RMSNorm against MLX's fast functions, alone and in a model."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxcel_core.kernels import cpu_matvec
from mlxcel_core.threads import thread_stream
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.cpu_ops import CompiledRMSNorm, RopeTable, TableRoPE, install_cpu_ops
from mlxcel_models.loading.loader import load_model
from mlxcel_models.rope import FrequencyFactorRoPE

from factories import TinyConfig, write_gguf_model

OFFSETS = [
    ((16, 9, 1, 64), mx.array(list(range(3, 19)), dtype=mx.int32)),
    ((1, 9, 37, 64), 5),
    ((2, 3, 4, 64), mx.array([0, 7], dtype=mx.int32)),
    ((1, 2, 3, 64), mx.array(6, dtype=mx.int32)),
]


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [64, 48])
@pytest.mark.parametrize(("shape", "offset"), OFFSETS)
def test_table_rope_equals_fast_rope(traditional, dims, shape, offset):
    rope = nn.RoPE(dims, traditional=traditional, base=100000.0, scale=0.5)
    table_rope = TableRoPE.replacing(rope, RopeTable())
    x = mx.random.normal(shape, key=mx.random.key(dims))
    assert mx.array_equal(table_rope(x, offset=offset), rope(x, offset=offset))
    assert (table_rope.dims, table_rope.base, table_rope.scale) == (dims, 100000.0, 0.5)


def test_table_rope_equals_frequency_factor_rope():
    factors = mx.linspace(1.0, 8.0, 32)
    rope = FrequencyFactorRoPE(64, 500000.0, factors)
    table_rope = TableRoPE.replacing(rope, RopeTable())
    x = mx.random.normal((2, 4, 3, 64), key=mx.random.key(1))
    offset = mx.array([4, 9], dtype=mx.int32)
    assert mx.array_equal(table_rope(x, offset=offset), rope(x, offset=offset))


def test_other_ropes_are_left_alone():
    assert TableRoPE.replacing(nn.Linear(4, 4), RopeTable()) is None


def test_a_shared_table_is_recomputed_for_new_positions_and_other_frequencies():
    table = RopeTable()
    slow = TableRoPE.replacing(nn.RoPE(64, base=10000.0), table)
    fast = TableRoPE.replacing(nn.RoPE(64, base=500.0), table)
    x = mx.random.normal((2, 4, 1, 64), key=mx.random.key(2))
    for offsets in ([1, 2], [5, 6], [5, 6]):
        offset = mx.array(offsets, dtype=mx.int32)  # a new array each time
        for rope, base in ((slow, 10000.0), (fast, 500.0)):
            expected = mx.fast.rope(x, 64, traditional=False, base=base, scale=1.0, offset=offset)
            assert mx.array_equal(rope(x, offset=offset), expected)
    assert mx.array_equal(slow(x, offset=3), nn.RoPE(64, base=10000.0)(x, offset=3))


def test_compiled_rms_norm_equals_rms_norm():
    norm = nn.RMSNorm(64, eps=1e-5)
    norm.weight = mx.random.normal((64,), key=mx.random.key(3))
    compiled = CompiledRMSNorm(norm)
    for shape in ((16, 1, 64), (1, 37, 64)):
        x = mx.random.normal(shape, key=mx.random.key(4))
        assert mx.array_equal(compiled(x), norm(x))


def _primitives(array: mx.array, tmp_path: Path) -> list[str]:
    path = tmp_path / "graph.dot"
    mx.export_to_dot(str(path), array)
    return re.findall(r'\[label ="([^"]+)", shape=rectangle\]', path.read_text())


@pytest.mark.parametrize("rope_scaling", [None, "llama3"])
def test_a_model_with_cpu_ops_gives_the_same_logits_in_fewer_operations(
    tmp_path: Path, rope_scaling: str | None, monkeypatch: pytest.MonkeyPatch
):
    # RoPE and RMSNorm only: the SwiGLU kernel (tests/models/test_cpu_mlp.py) computes
    # outside MLX's graph, so the graph would start after the last MLP.
    monkeypatch.setattr(cpu_matvec, "available", lambda: False)
    scaling = None
    if rope_scaling == "llama3":
        scaling = {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
    config = TinyConfig(num_layers=3, llama3_rope_scaling=scaling)
    path = write_gguf_model(tmp_path / "tiny.gguf", config)
    dense = ComputeOptions(mx.float32, dense_weights_max_bytes=2**30)
    plain = load_model(path, compute=dense)
    fused = load_model(
        path, compute=ComputeOptions(mx.float32, dense_weights_max_bytes=2**30, cpu_ops=True)
    )
    layers = [type(m) for _, m in fused.model.module.named_modules()]
    assert layers.count(TableRoPE) == 3 and layers.count(CompiledRMSNorm) == 7
    tokens = mx.array([[5, 80, 81, 200, 17, 42, 9, 260]])
    expected = plain.model(tokens, plain.model.make_cache())
    actual = fused.model(tokens, fused.model.make_cache())
    ops_plain, ops_fused = _primitives(expected, tmp_path), _primitives(actual, tmp_path)
    assert ops_fused.count("Cos") == 1  # one table for every layer
    assert len(ops_fused) < len(ops_plain)
    assert mx.array_equal(actual, expected)


def test_install_counts_what_it_replaces():
    module = nn.Sequential(nn.RMSNorm(8), nn.Linear(8, 8), nn.RoPE(8))
    assert install_cpu_ops(module) == 2
    assert [type(layer) for layer in module.layers] == [CompiledRMSNorm, nn.Linear, TableRoPE]


def test_each_thread_keeps_its_own_rope_table_entry():
    # A prefill rank and an engine sharing one model in one process: the entry one thread
    # left unevaluated on its stream must not reach the other.
    table = RopeTable()
    inv_freqs = mx.array([1.0, 0.5], dtype=mx.float32)
    mine = table.lookup("rope", 0, 4, inv_freqs)
    theirs = []

    def other_thread():
        with thread_stream(mx.Device(mx.cpu)):
            cos, sin = table.lookup("rope", 0, 4, inv_freqs)
            mx.eval(cos, sin)
            theirs.append((cos, sin))

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert theirs and theirs[0][0] is not mine[0]
    np.testing.assert_allclose(np.array(theirs[0][0]), np.array(mine[0]))
    assert table.lookup("rope", 0, 4, inv_freqs)[0] is mine[0]
