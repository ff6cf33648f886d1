"""The paged KV path on a real model equals the dense one, logits at every position.

The tests run tiny random-weight llamas through `PagedKVStorage`, `PagedBatch` and
`KVCacheManager` block tables the way the engine does (chunked prefill, batched decode with
rows at different offsets, prefix hits, copy-on-write, decode rows attending by length
groups, prefill chunks at rounded lengths) and compare every position's logits with the
same tokens run alone through dense caches. A llama with a sliding-window layer is
compared with mlx-lm's own model call and caches as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.cache.paged import (
    BatchRow,
    KVCacheManager,
    PagedBatch,
    PagedKVStorage,
    make_layer_caches,
)
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.language_model import LanguageModel
from mlxcel_models.compute import ComputeOptions
from mlxcel_models.loading.loader import load_model

from factories import TinyConfig, write_safetensors_model, write_sliding_window_model
from paged_attention_checks import BLOCK_SIZE, FLOAT32_TOLERANCE, ON_THE_CPU, count_group_passes

# Q8_0 layers switch between the quantized and the dequantized product by row count, and
# a padded batch has more rows than one sequence alone.
Q8_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def load_in_float32(path) -> LanguageModel:
    """The model at `path` as this device runs it, but with float32 activations.

    A GPU keeps the file's dtypes, and a Q8_0 file's float16 scales make the activations
    float16, whose rounding (logits differ by ~1e-2 between a padded batch and one
    sequence alone) would hide what these tests look for: a wrong position or block.
    """
    options = ComputeOptions.for_device(mx.default_device())
    return load_model(path, compute=dataclasses.replace(options, float_dtype=mx.float32)).model


# A real model over paged KV


class PagedHarness:
    """Runs sequences through a model over paged KV, as the engine does.

    Each `step` is one forward pass over every sequence given, prefill chunks and decode
    rows together, padded to the longest chunk (the engine's runner keeps long rows apart;
    `PagedBatch` allows both). Positions are allocated through the KV manager first, block
    tables read once every allocation (and copy-on-write swap) is done, and full blocks
    committed afterwards.
    """

    def __init__(self, model: LanguageModel, *, num_blocks: int = 64) -> None:
        self.model = model
        layers = profile_model(model, BLOCK_SIZE).layers
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE)
        self.storage = PagedKVStorage(layers, BLOCK_SIZE, num_blocks)
        self.tokens: dict[int, list[int]] = {}
        self.num_computed: dict[int, int] = {}
        self.chunks: dict[int, list[int]] = {}

    def admit(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Give a sequence its prefix-cache hit; return the cached tokens."""
        num_cached = self.kv.admit(seq_id, token_ids, 1)
        assert num_cached is not None
        self.tokens[seq_id] = list(token_ids)
        self.num_computed[seq_id] = num_cached
        self.chunks[seq_id] = [num_cached] if num_cached else []
        return num_cached

    def step(self, work: dict[int, int]) -> dict[int, mx.array]:
        """Compute `work[seq_id]` more tokens of each sequence; return their (n, V) logits."""
        rows, inputs = [], []
        num_queries = max(work.values())
        for seq_id, num_new in work.items():
            start = self.num_computed[seq_id]
            assert self.kv.allocate_slots(seq_id, start, num_new)
            chunk = self.tokens[seq_id][start : start + num_new]
            assert len(chunk) == num_new
            inputs.append(chunk + [0] * (num_queries - num_new))
        for seq_id, num_new in work.items():
            rows.append(BatchRow(self.kv.block_table(seq_id), self.num_computed[seq_id], num_new))
        self.storage.ensure_capacity(self.kv.materialized_blocks[0])
        self.storage.copy_blocks(self.kv.take_block_copies())
        batch = PagedBatch(rows, BLOCK_SIZE)
        logits = self.model(
            mx.array(inputs, dtype=mx.int32), make_layer_caches(self.storage, batch)
        )
        mx.eval(logits, self.storage.arrays())
        result = {}
        for b, (seq_id, num_new) in enumerate(work.items()):
            result[seq_id] = logits[b, :num_new]
            self.num_computed[seq_id] += num_new
            self.chunks[seq_id].append(num_new)
            self.kv.commit(seq_id, self.tokens[seq_id], self.num_computed[seq_id])
        return result


def dense_logits(model: LanguageModel, token_ids: Sequence[int], chunks: Sequence[int]) -> mx.array:
    """(T, V) logits of the tokens run alone through dense caches, chunk by chunk."""
    cache = model.make_cache()
    pieces, start = [], 0
    for size in chunks:
        pieces.append(model(mx.array([token_ids[start : start + size]]), cache)[0])
        start += size
    return mx.concatenate(pieces)


def check_against_dense(harness: PagedHarness, paged: dict[int, list[mx.array]], tolerance):
    """Each sequence's paged logits (its latest positions) equal its dense logits there."""
    for seq_id, pieces in paged.items():
        reference = dense_logits(harness.model, harness.tokens[seq_id], harness.chunks[seq_id])
        got = mx.concatenate(pieces)
        np.testing.assert_allclose(np.array(got), np.array(reference[-got.shape[0] :]), **tolerance)


def random_tokens(seed: int, lengths: Sequence[int]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 250, n).tolist() for n in lengths]


@pytest.mark.parametrize(
    ("fixture", "tolerance"), [("tiny_safetensors", FLOAT32_TOLERANCE), ("tiny_gguf", Q8_TOLERANCE)]
)
def test_chunked_prefill_and_batched_decode_at_different_offsets_match_dense(
    request, fixture, tolerance
):
    model = load_in_float32(request.getfixturevalue(fixture))
    harness = PagedHarness(model)
    # Prompts of 3, 7 and 13 tokens, then 6, 6 and 5 decode tokens (teacher-forced).
    sequences = random_tokens(0, [3 + 6, 7 + 6, 13 + 5])
    for seq_id, tokens in enumerate(sequences):
        assert harness.admit(seq_id, tokens) == 0
    paged: dict[int, list[mx.array]] = {0: [], 1: [], 2: []}
    # Prefill chunks of different lengths share passes with decode rows, then every row
    # decodes at its own offset.
    schedule = [
        {0: 3, 1: 5},
        {0: 1, 1: 2, 2: 6},
        {2: 7, 0: 1, 1: 1},
        *[{0: 1, 1: 1, 2: 1}] * 3,
        {1: 1, 2: 1, 0: 1},
        {2: 1, 1: 1},
    ]
    for work in schedule:
        for seq_id, logits in harness.step(work).items():
            paged[seq_id].append(logits)
    assert [harness.num_computed[s] for s in range(3)] == [9, 13, 18]
    assert len(set(harness.kv.block_table(2)) & set(harness.kv.block_table(1))) == 0
    check_against_dense(harness, paged, tolerance)


@ON_THE_CPU
def test_decode_rows_far_apart_in_length_attend_by_groups_and_match_dense(
    tiny_safetensors, monkeypatch
):
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    # The groups serve decode passes no kernel reads the pools for.
    harness.storage.decode_kernel = False
    calls = count_group_passes(monkeypatch)
    # Prompts of 150 and 8 tokens, then 4 decode tokens each (teacher-forced).
    sequences = random_tokens(2, [150 + 4, 8 + 4])
    for seq_id, tokens in enumerate(sequences):
        assert harness.admit(seq_id, tokens) == 0
    paged: dict[int, list[mx.array]] = {0: [], 1: []}
    for work in [{0: 150}, {1: 8}, *[{0: 1, 1: 1}] * 4]:
        for seq_id, logits in harness.step(work).items():
            paged[seq_id].append(logits)
    # Every layer of every two-row decode pass took the groups, one row in each.
    assert calls == [2] * (4 * len(harness.storage.layers))
    check_against_dense(harness, paged, FLOAT32_TOLERANCE)


def test_copy_on_write_after_fork_keeps_each_sequence_reading_its_own_kv(tiny_safetensors):
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    prompt = random_tokens(1, [6])[0]
    parent_tokens, child_tokens = [*prompt, 17, 40, 41], [*prompt, 99, 50, 51]
    harness.admit(0, parent_tokens)
    parent_prompt_logits = harness.step({0: 6})[0]
    # The child shares both prompt blocks; the second is half full, so the first write into
    # it by either sequence must go to a copy.
    harness.kv.fork(0, 1, 6)
    harness.tokens[1], harness.num_computed[1], harness.chunks[1] = child_tokens, 6, [6]
    shared = harness.kv.block_table(0)
    assert harness.kv.block_table(1) == shared
    paged: dict[int, list[mx.array]] = {0: [parent_prompt_logits], 1: []}
    for _ in range(3):
        for seq_id, logits in harness.step({0: 1, 1: 1}).items():
            paged[seq_id].append(logits)
    # The parent wrote first and got the copy; the child then held the original alone.
    parent_table, child_table = harness.kv.block_table(0), harness.kv.block_table(1)
    assert parent_table[0] == child_table[0] == shared[0]
    assert child_table[1] == shared[1] != parent_table[1]
    check_against_dense(harness, paged, FLOAT32_TOLERANCE)


def test_copy_on_write_copy_is_needed_for_the_shared_positions(tiny_safetensors):
    """Without `copy_blocks`, the copied-out sequence would read zeros for positions 4..5."""
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    prompt = random_tokens(2, [6])[0]
    harness.admit(0, [*prompt, 17])
    harness.step({0: 6})
    harness.kv.fork(0, 1, 6)
    harness.tokens[1], harness.num_computed[1], harness.chunks[1] = [*prompt, 99], 6, [6]
    assert harness.kv.allocate_slots(0, 6, 1)
    copies = harness.kv.take_block_copies()
    assert [(c.src_block_id, c.dst_block_id) for c in copies] == [
        (harness.kv.block_table(1)[1], harness.kv.block_table(0)[1])
    ]
    harness.storage.copy_blocks(copies)
    # Positions 4 and 5 are the first two slots of the copied block.
    src = mx.arange(2) + copies[0].src_block_id * BLOCK_SIZE
    dst = mx.arange(2) + copies[0].dst_block_id * BLOCK_SIZE
    for pools in (harness.storage.keys, harness.storage.values):
        for (pool,) in pools:
            copied = np.array(pool[dst])
            np.testing.assert_array_equal(copied, np.array(pool[src]))
            assert np.abs(copied).min(axis=(1, 2)).all()


def test_one_row_prefill_chunks_at_rounded_lengths_match_dense(tiny_safetensors, monkeypatch):
    # What CUDA does (`prefill_lengths`), forced here: every chunk after the first starts
    # at an offset, so the rounded keys must stay aligned with the real queries.
    from mlxcel_core.cache.paged import layer_cache as layer_cache_module

    rounded: list[int] = []
    attend = layer_cache_module.causal_attention_at_rounded_length

    def counted(queries, keys, values, *, scale):
        rounded.append(queries.shape[2])
        return attend(queries, keys, values, scale=scale)

    monkeypatch.setattr(layer_cache_module, "rounds_prefill_lengths", lambda queries, values: True)
    monkeypatch.setattr(layer_cache_module, "causal_attention_at_rounded_length", counted)
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    tokens = random_tokens(3, [150 + 3])[0]
    assert harness.admit(0, tokens) == 0
    paged: dict[int, list[mx.array]] = {0: []}
    for work in [{0: 70}, {0: 50}, {0: 30}, *[{0: 1}] * 3]:
        paged[0].extend(harness.step(work).values())
    num_layers = len(harness.storage.layers)
    assert rounded == [70] * num_layers + [50] * num_layers + [30] * num_layers
    check_against_dense(harness, paged, FLOAT32_TOLERANCE)


# Sliding-window attention


SLIDING_WINDOW = 5


@pytest.fixture(scope="module")
def sliding_models(tmp_path_factory) -> tuple[LanguageModel, LanguageModel]:
    """The same tiny llama weights with a sliding-window first layer, and without."""
    config = TinyConfig(seed=3)
    windowed = write_sliding_window_model(
        tmp_path_factory.mktemp("swa") / "llama", config, SLIDING_WINDOW
    )
    full = write_safetensors_model(tmp_path_factory.mktemp("full") / "llama", config)
    return load_model(windowed).model, load_model(full).model


def mlx_lm_logits(model: LanguageModel, token_ids: Sequence[int]) -> mx.array:
    """(T, V) logits from mlx-lm's own model call with its own caches (RotatingKVCache)."""
    module = model.module  # type: ignore[attr-defined]
    return module(mx.array([token_ids]), cache=module.make_cache())[0]


def test_the_sliding_window_fixture_really_windows(sliding_models):
    windowed, full = sliding_models
    module = windowed.module
    assert [layer.use_sliding for layer in module.model.layers] == [True, False]
    tokens = random_tokens(4, [14])[0]
    with_window, without = mlx_lm_logits(windowed, tokens), mlx_lm_logits(full, tokens)
    # Positions inside the first window see the same keys; later ones do not.
    np.testing.assert_allclose(
        np.array(with_window[:SLIDING_WINDOW]), np.array(without[:SLIDING_WINDOW]), atol=1e-5
    )
    assert not np.allclose(
        np.array(with_window[SLIDING_WINDOW:]), np.array(without[SLIDING_WINDOW:]), atol=1e-3
    )


def test_sliding_window_layers_match_mlx_lm_with_prefix_reuse(sliding_models):
    windowed, _ = sliding_models
    harness = PagedHarness(windowed)
    first = random_tokens(5, [14 + 4])[0]
    # The second shares the first's 12-token prefix (3 full blocks), then diverges.
    second = [*first[:12], *random_tokens(6, [3 + 4])[0]]
    harness.admit(0, first)
    paged: dict[int, list[mx.array]] = {0: [], 1: []}
    for work in ({0: 6}, {0: 8}, {0: 1}):
        paged[0].extend(harness.step(work).values())
    assert harness.admit(1, second) == 12
    # The second's prompt tail runs beside the first's decode rows; its window reaches back
    # into the shared blocks.
    for work in ({0: 1, 1: 3}, {0: 1, 1: 1}, {0: 1, 1: 1}, {1: 1}, {1: 1}):
        for seq_id, logits in harness.step(work).items():
            paged[seq_id].append(logits)
    assert harness.kv.block_table(1)[:3] == harness.kv.block_table(0)[:3]
    for seq_id, tokens in ((0, first), (1, second)):
        reference = mlx_lm_logits(windowed, tokens)
        got = mx.concatenate(paged[seq_id])
        start = len(tokens) - got.shape[0]
        assert start == (0 if seq_id == 0 else 12)
        np.testing.assert_allclose(np.array(got), np.array(reference[start:]), **FLOAT32_TOLERANCE)


def test_sliding_window_dense_path_matches_mlx_lm(sliding_models):
    """mlxcel's dense caches pass `window_size` through to the mask as mlx-lm's do."""
    windowed, _ = sliding_models
    tokens = random_tokens(7, [16])[0]
    stepped = dense_logits(windowed, tokens, [7, 1, 1, 7])
    np.testing.assert_allclose(
        np.array(stepped), np.array(mlx_lm_logits(windowed, tokens)), **FLOAT32_TOLERANCE
    )
