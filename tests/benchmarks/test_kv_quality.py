"""benchmarks/kv_quality.py on a tiny llama: paged perplexity equals a dense forward's,
attention errors order by bits, and the table has one row per cache type."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcel_models.loading.loader import load_model

from benchmark_scripts import load_benchmark
from factories import TinyConfig, write_safetensors_model

kv_quality = load_benchmark("kv_quality")

TOKENS = [(7 * i * i + 3 * i) % 250 + 5 for i in range(40)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A tiny llama with 32-feature heads, which q8_0 and q4_0 need."""
    config = TinyConfig(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    return write_safetensors_model(tmp_path_factory.mktemp("kvq") / "llama", config)


@pytest.fixture(scope="module")
def model(folder):
    return load_model(folder).model


def dense_perplexity(model, token_ids) -> float:
    logits = model(mx.array([token_ids]), model.make_cache())[0, :-1].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    targets = mx.array(token_ids[1:])[:, None]
    return math.exp(-mx.mean(mx.take_along_axis(logprobs, targets, axis=-1)).item())


def perplexity(model, token_ids, cache_type, chunk_size) -> float:
    return math.exp(mx.mean(kv_quality.token_nlls(model, token_ids, cache_type, chunk_size)).item())


@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_paged_perplexity_in_chunks_equals_one_dense_forward(model, chunk_size):
    expected = dense_perplexity(model, TOKENS)
    # OpenBLAS rounds a float32 product over one row differently from one over many; the
    # chunked passes agree with the whole-sequence pass to about 1e-6, not to the last bit.
    assert perplexity(model, TOKENS, "f32", chunk_size) == pytest.approx(expected, rel=1e-5)
    assert perplexity(model, TOKENS, "auto", chunk_size) == pytest.approx(expected, rel=1e-5)


def test_lossy_types_move_perplexity_and_attention_by_their_bits(model):
    layers = kv_quality.capture_activations(model, TOKENS)
    assert len(layers) == 2 and layers[0].queries.shape == (1, 4, len(TOKENS), 32)
    errors = {t: kv_quality.attention_error(layers, t) for t in ("f16", "q8_0", "turbo4", "turbo2")}
    assert errors["f16"] == 0
    assert 0 < errors["q8_0"] < errors["turbo4"] < errors["turbo2"]
    f16 = perplexity(model, TOKENS, "f16", 8)
    assert perplexity(model, TOKENS, "turbo2", 8) != pytest.approx(f16, rel=1e-6)


def test_the_perplexity_change_and_its_standard_error_follow_the_token_differences():
    reference = mx.array([2.0, 1.0, 3.0, 2.0])
    shifted = reference + mx.array([0.1, 0.3, 0.1, 0.3])
    change, error = kv_quality.perplexity_change(shifted, reference)
    assert change == pytest.approx(math.exp(0.2) - 1)
    # The differences' sample standard deviation is sqrt(4 * 0.01 / 3), over sqrt(4) tokens.
    assert error == pytest.approx(math.exp(0.2) * math.sqrt(0.04 / 3) / 2)
    assert kv_quality.perplexity_change(reference, reference) == (0.0, 0.0)


def test_a_residual_window_over_the_whole_text_gives_f16_perplexity(model):
    """Every position is then read from its exact (float16) copy: turbo2 equals f16, and
    a shorter window lies between them."""
    f16 = perplexity(model, TOKENS, "f16", 8)
    whole = kv_quality.token_nlls(model, TOKENS, "turbo2", 8, residual=len(TOKENS))
    assert math.exp(mx.mean(whole).item()) == pytest.approx(f16, rel=1e-6)
    short = math.exp(mx.mean(kv_quality.token_nlls(model, TOKENS, "turbo2", 1, 4)).item())
    assert short != pytest.approx(f16, rel=1e-6)
    assert short != pytest.approx(perplexity(model, TOKENS, "turbo2", 1), rel=1e-6)
    # 2 layers x 2 KV heads x 2 x 32 float16 features per exact position; a window of 10
    # can touch two blocks of 16, spread over 40 tokens.
    exact = 2 * 2 * 2 * 32 * 2
    stored = kv_quality.kv_bytes_per_token(model, "turbo2")
    assert kv_quality.kv_bytes_per_token(model, "turbo2", 10, 40) == stored + exact * 32 / 40


def test_the_table_has_a_row_per_type_with_its_bytes(folder, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("The bridge was painted green. Owls hunt at night.")
    kv_quality.main(["-m", str(folder), "--text", str(text), "--chunk", "16",
                     "--types", "f16", "q8_0", "turbo4", "q8_0/turbo4"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert " tokens, prefill chunks of 16, residual window of 0, attention " in lines[0]
    rows = [line.split("|")[1:-1] for line in lines[3:]]
    assert [r[0].strip() for r in rows] == ["f16", "q8_0", "turbo4", "q8_0/turbo4"]
    # 2 layers x 2 KV heads x (keys + values) x bytes per 32-feature vector.
    assert [int(r[1]) for r in rows] == [2 * 2 * 2 * 64, 2 * 2 * 2 * 34, 2 * 2 * 2 * 21,
                                         2 * 2 * (34 + 21)]  # fmt: skip
    assert rows[0][5].strip() == "+0.000%" and rows[0][6].strip() == "0.000%"
    with pytest.raises(SystemExit):
        kv_quality.main(["-m", str(folder), "--types", "q8_0/q5_1"])
