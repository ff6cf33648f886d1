"""benchmarks/kv_recent_window.py on a tiny llama: the window's positions are read exactly
and the rest as the type stores them, and the table has a row per type and window."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from mlxcel_models.loading.loader import load_model

from benchmark_scripts import load_benchmark
from factories import TinyConfig, write_safetensors_model

# The window script imports kv_quality by name, as it does when run from benchmarks/.
load_benchmark("kv_quality")
kv_recent_window = load_benchmark("kv_recent_window")

TOKENS = [(7 * i * i + 3 * i) % 250 + 5 for i in range(40)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    config = TinyConfig(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    return write_safetensors_model(tmp_path_factory.mktemp("kvw") / "llama", config)


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder).model


def random_attention_inputs(length: int) -> tuple[mx.array, mx.array, mx.array]:
    mx.random.seed(3)
    queries = mx.random.normal((1, 4, length, 32))
    keys = mx.random.normal((1, 2, length, 32)) + 2.0
    values = mx.random.normal((1, 2, length, 32))
    return queries, keys, values


def test_queries_within_the_window_of_every_key_read_them_all_exactly():
    queries, keys, values = random_attention_inputs(24)
    exact = mx.fast.scaled_dot_product_attention(
        queries, mx.repeat(keys, 2, axis=1), mx.repeat(values, 2, axis=1),
        scale=0.2, mask="causal",
    )  # fmt: skip
    output = kv_recent_window.windowed_attention(queries, keys, values, 0.2, "turbo2", 10)
    error = mx.abs(output - exact).max(axis=(0, 1, 3))
    # Query t sees positions 0..t, all within 10 of it while t < 10.
    assert error[:10].max().item() < 1e-5
    assert error[10:].min().item() > 1e-3


def test_window_zero_reads_every_position_as_the_type_stores_it():
    queries, keys, values = random_attention_inputs(24)
    stored_keys = kv_recent_window.stored("turbo2", keys)
    stored_values = kv_recent_window.stored("turbo2", values)
    expected = mx.fast.scaled_dot_product_attention(
        queries, mx.repeat(stored_keys, 2, axis=1), mx.repeat(stored_values, 2, axis=1),
        scale=0.2, mask="causal",
    )  # fmt: skip
    output = kv_recent_window.windowed_attention(queries, keys, values, 0.2, "turbo2", 0)
    assert mx.allclose(output, expected, atol=1e-5).item()


def test_perplexity_moves_only_where_the_type_is_lossy_and_the_window_short(model):
    exact = kv_recent_window.token_nlls(model, TOKENS, kv_recent_window.EXACT, 0)
    lossless = kv_recent_window.token_nlls(model, TOKENS, "f32", 0)
    whole_window = kv_recent_window.token_nlls(model, TOKENS, "turbo2", len(TOKENS))
    lossy = kv_recent_window.token_nlls(model, TOKENS, "turbo2", 4)
    assert mx.allclose(lossless, exact, atol=1e-4).item()
    assert mx.allclose(whole_window, exact, atol=1e-4).item()
    assert not mx.allclose(lossy, exact, atol=1e-3).item()


def test_bytes_per_token_count_the_window_at_float16(model):
    f16 = kv_recent_window.kv_bytes_per_token(model, "f16")
    turbo4 = kv_recent_window.kv_bytes_per_token(model, "turbo4")
    assert kv_recent_window.bytes_per_token(model, "turbo4", 0, 40) == turbo4
    assert kv_recent_window.bytes_per_token(model, "turbo4", 64, 40) == f16
    assert (
        kv_recent_window.bytes_per_token(model, "turbo4", 10, 40) == (10 * f16 + 30 * turbo4) / 40
    )


def test_the_table_has_a_row_per_type_and_window(folder, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("The bridge was painted green. Owls hunt at night.")
    kv_recent_window.main(["-m", str(folder), "--text", str(text),
                           "--types", "f16", "turbo4", "--windows", "0", "4"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[3:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("f16", "0"),
        ("f16", "4"),
        ("turbo4", "0"),
        ("turbo4", "4"),
    ]
    assert rows[0][3] == "1.000x"
    for bad in (["--windows", "-1"], ["--types", "q5_1"]):
        with pytest.raises(SystemExit):
            kv_recent_window.main(["-m", str(folder), *bad])
