"""Splitting a decoder's layers into contiguous pipeline stages balanced by memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence

StageLoad = Callable[[int, int, int], int]
"""Bytes stage s holds with layers start .. stop - 1: load(s, start, stop)."""

_INFINITE = float("inf")


def split_layers(
    layer_bytes: Sequence[int], num_stages: int, *, stage_bytes: Sequence[int] = ()
) -> list[range]:
    """Split layers into `num_stages` contiguous, non-empty ranges balanced by bytes.

    A stage's load is its layers' bytes plus its own fixed bytes (`stage_bytes`: the
    first stage holds the embedding, the last the final norm and LM head). The split is an
    exact solution of the linear partition problem (Skiena, The Algorithm Design Manual,
    section 8.5) by dynamic programming in O(num_stages * num_layers^2): first the
    smallest achievable largest load, then, among the splits that reach it, the one with
    the smallest sum of squared loads, so the other stages are balanced too. Ties go to the
    split whose earlier stages end first.

    Args:
        layer_bytes: bytes of each layer's parameters, in model order.
        num_stages: pipeline stages (ranks), 1 <= num_stages <= len(layer_bytes).
        stage_bytes: bytes each stage holds besides its layers, one per stage; empty for
            none.

    Returns:
        One range of layer indices per stage, in stage order, together covering every
        layer exactly once.

    Raises:
        ValueError: `num_stages` is out of range, `stage_bytes` does not have one entry
            per stage, or a byte count is negative.
    """
    num_layers = len(layer_bytes)
    if num_layers < 1:
        raise ValueError("layer_bytes must hold at least one layer")
    if not 1 <= num_stages <= num_layers:
        raise ValueError(
            f"num_stages must be between 1 and the number of layers ({num_layers}), "
            f"got {num_stages}"
        )
    fixed = list(stage_bytes) or [0] * num_stages
    if len(fixed) != num_stages:
        raise ValueError(
            f"stage_bytes must hold one entry per stage ({num_stages}), got {len(fixed)}"
        )
    for name, sizes in (("layer_bytes", layer_bytes), ("stage_bytes", fixed)):
        if min(sizes) < 0:
            raise ValueError(f"{name} must all be >= 0, got {min(sizes)}")
    prefix = [0]
    for size in layer_bytes:
        prefix.append(prefix[-1] + size)

    def load(stage: int, start: int, stop: int) -> int:
        return fixed[stage] + prefix[stop] - prefix[start]

    largest = _smallest_largest_load(num_layers, num_stages, load)
    return _most_even_split(num_layers, num_stages, load, largest)


def _smallest_largest_load(num_layers: int, num_stages: int, load: StageLoad) -> float:
    """The smallest largest stage load over all splits."""
    # best[i]: the smallest largest load of the first i layers in the stages so far.
    best = [load(0, 0, i) if i >= 1 else _INFINITE for i in range(num_layers + 1)]
    for stage in range(1, num_stages):
        best = [
            min((max(best[j], load(stage, j, i)) for j in range(stage, i)), default=_INFINITE)
            for i in range(num_layers + 1)
        ]
    return best[num_layers]


def _most_even_split(
    num_layers: int, num_stages: int, load: StageLoad, largest: float
) -> list[range]:
    """Among splits whose loads are all <= `largest`, the one with the least squared loads."""
    # cost[s][i]: least sum of squared loads of the first i layers in stages 0..s.
    cost = [[_INFINITE] * (num_layers + 1) for _ in range(num_stages)]
    start_of = [[0] * (num_layers + 1) for _ in range(num_stages)]
    for i in range(1, num_layers + 1):
        if load(0, 0, i) <= largest:
            cost[0][i] = load(0, 0, i) ** 2
    for stage in range(1, num_stages):
        for i in range(stage + 1, num_layers + 1):
            for j in range(stage, i):
                stage_load = load(stage, j, i)
                if stage_load > largest or cost[stage - 1][j] == _INFINITE:
                    continue
                total = cost[stage - 1][j] + stage_load**2
                if total < cost[stage][i]:
                    cost[stage][i], start_of[stage][i] = total, j
    ranges = []
    stop = num_layers
    for stage in reversed(range(num_stages)):
        start = start_of[stage][stop]
        ranges.append(range(start, stop))
        stop = start
    return ranges[::-1]
