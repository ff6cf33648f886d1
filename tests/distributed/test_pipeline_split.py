"""`split_layers`: contiguous, memory-balanced pipeline stages."""

from __future__ import annotations

import itertools
import random

import pytest

from mlxcel_distributed.pipeline_split import split_layers


def loads(ranges: list[range], layer_bytes: list[int], stage_bytes: list[int]) -> list[int]:
    pairs = zip(ranges, stage_bytes, strict=True)
    return [fixed + sum(layer_bytes[i] for i in r) for r, fixed in pairs]


def brute_force_largest_load(layer_bytes: list[int], stage_bytes: list[int]) -> int:
    """The smallest largest load over every way to cut the layers into len(stage_bytes)."""
    n, p = len(layer_bytes), len(stage_bytes)
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = [0, *cuts, n]
        ranges = [range(a, b) for a, b in itertools.pairwise(bounds)]
        largest = max(loads(ranges, layer_bytes, stage_bytes))
        best = largest if best is None else min(best, largest)
    assert best is not None
    return best


def test_equal_layers_split_evenly_and_contiguously():
    ranges = split_layers([100] * 30, 4)
    assert [len(r) for r in ranges] == [7, 7, 8, 8]
    assert [i for r in ranges for i in r] == list(range(30))


def test_one_stage_takes_every_layer():
    assert split_layers([5, 1, 7], 1) == [range(0, 3)]


def test_as_many_stages_as_layers_gives_one_layer_each():
    assert split_layers([9, 1, 4, 2], 4) == [range(i, i + 1) for i in range(4)]


def test_heavy_layers_get_stages_of_their_own():
    assert split_layers([10, 1, 1, 1, 1, 1, 1, 10], 3) == [range(0, 1), range(1, 7), range(7, 8)]


def test_stage_bytes_move_layers_off_the_stages_that_hold_embeddings_and_head():
    # SmolLM2 float32: 30 layers of 14.16 MB; the tied embedding (113 MB, 8 layers' worth)
    # on the first and the last stage. Loads 212, 212, 226 MB; (8, 15, 7) layers would
    # give the same largest and squares, and the tie goes to the earlier cut.
    layer_bytes, embedding = [14_160_384] * 30, 113_246_208
    ranges = split_layers(layer_bytes, 3, stage_bytes=[embedding, 0, embedding])
    assert [(r.start, r.stop) for r in ranges] == [(0, 7), (7, 22), (22, 30)]


@pytest.mark.parametrize("seed", range(6))
def test_the_largest_stage_is_as_small_as_any_split_allows(seed):
    rng = random.Random(seed)
    layer_bytes = [rng.randint(1, 50) for _ in range(rng.randint(3, 9))]
    num_stages = rng.randint(1, len(layer_bytes))
    stage_bytes = [rng.randint(0, 30) for _ in range(num_stages)]
    ranges = split_layers(layer_bytes, num_stages, stage_bytes=stage_bytes)
    assert [i for r in ranges for i in r] == list(range(len(layer_bytes)))
    assert all(len(r) >= 1 for r in ranges)
    largest = max(loads(ranges, layer_bytes, stage_bytes))
    assert largest == brute_force_largest_load(layer_bytes, stage_bytes)


@pytest.mark.parametrize(
    ("layer_bytes", "num_stages", "stage_bytes", "message"),
    [
        ([1, 2, 3], 0, (), "num_stages must be between 1 and the number of layers"),
        ([1, 2, 3], 4, (), r"number of layers \(3\), got 4"),
        ([], 1, (), "at least one layer"),
        ([1, 2, 3], 2, [0], r"one entry per stage \(2\), got 1"),
        ([1, -2, 3], 2, (), "layer_bytes must all be >= 0, got -2"),
        ([1, 2, 3], 2, [0, -5], "stage_bytes must all be >= 0, got -5"),
    ],
)
def test_bad_arguments_raise_value_errors(layer_bytes, num_stages, stage_bytes, message):
    with pytest.raises(ValueError, match=message):
        split_layers(layer_bytes, num_stages, stage_bytes=stage_bytes)
