"""The timing harness's interleaving and the rule that keeps or refuses a winner."""

from __future__ import annotations

import pytest

from mlxcel_core.autotune import Measurement, choose, measure_interleaved, search


class FakeClock:
    """A timer whose readings advance by the duration the timed call says it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed_by(durations: dict[int, list[float]], clock: FakeClock, calls: list[int]):
    """A `run` that records its candidate and advances `clock` by that candidate's next
    duration; the warm-up call, which takes the first duration, is not timed."""
    remaining = {candidate: list(values) for candidate, values in durations.items()}

    def run(candidate: int) -> None:
        calls.append(candidate)
        clock.now += remaining[candidate].pop(0)

    return run


def test_each_round_times_every_candidate_once_in_an_order_rotated_per_round():
    calls: list[int] = []
    measure_interleaved([1, 2, 3], calls.append, rounds=4, timer=lambda: 0.0)
    warm_up, rounds = calls[:3], calls[3:]
    assert warm_up == [1, 2, 3]
    assert rounds == [1, 2, 3, 2, 3, 1, 3, 1, 2, 1, 2, 3]


def test_samples_are_the_timed_calls_only_in_round_order():
    clock, calls = FakeClock(), []
    durations = {4: [9.0, 1.0, 2.0, 3.0], 8: [9.0, 5.0, 6.0, 7.0]}
    measurements = measure_interleaved(
        [4, 8], timed_by(durations, clock, calls), rounds=3, timer=clock
    )
    assert [m.candidate for m in measurements] == [4, 8]
    assert measurements[0].samples == (1.0, 2.0, 3.0)
    assert measurements[1].samples == (5.0, 6.0, 7.0)


@pytest.mark.parametrize(
    ("candidates", "rounds", "message"),
    [([], 3, "at least one"), ([1, 1], 3, "distinct"), ([1, 2], 1, "rounds must be >= 2")],
)
def test_bad_searches_are_refused(candidates, rounds, message):
    with pytest.raises(ValueError, match=message):
        measure_interleaved(candidates, lambda _: None, rounds=rounds)


def test_spread_is_the_interquartile_range_and_ignores_one_outlier():
    steady = Measurement(1, (1.0, 1.0, 1.0, 1.0, 1.0))
    one_stall = Measurement(1, (1.0, 1.0, 1.0, 1.0, 50.0))
    assert steady.spread == 0.0
    assert one_stall.spread == 0.0
    assert one_stall.median == 1.0
    assert Measurement(1, (1.0, 2.0, 3.0, 4.0, 5.0)).spread == 2.0


def test_a_faster_median_within_the_spread_is_refused():
    default = Measurement(512, (10.0, 11.0, 12.0, 13.0, 14.0))  # median 12, IQR 2
    noisy = Measurement(256, (7.0, 9.0, 10.0, 11.0, 13.0))  # median 10, IQR 2
    verdict = choose([noisy, default], 512)
    assert verdict.best == 256
    assert not verdict.accepted
    assert verdict.chosen == 512
    assert verdict.margin == 2.0 and verdict.threshold == 4.0
    assert verdict.describe().startswith(
        "default kept: best 256 did not beat the default 512 by more than the spread"
    )


def test_a_winner_clear_of_both_spreads_is_accepted():
    default = Measurement(512, (10.0, 11.0, 12.0, 13.0, 14.0))
    clear = Measurement(1024, (6.0, 6.5, 7.0, 7.5, 8.0))  # median 7, IQR 1: 5 > 2 + 1
    verdict = choose([default, clear], 512)
    assert verdict.accepted
    assert verdict.chosen == 1024
    assert verdict.describe().startswith("winner 1024:")


def test_the_default_stays_when_it_is_the_fastest():
    verdict = choose([Measurement(1, (1.0, 1.0)), Measurement(2, (2.0, 2.0))], 1)
    assert not verdict.accepted and verdict.best == 1
    assert verdict.describe() == "default kept: the default 1 was the fastest"


def test_a_search_with_an_injected_timer_refuses_noise_and_keeps_a_clear_winner():
    clock = FakeClock()
    # Candidate 2 is faster in its median by less than the timings' jitter.
    jittery = {1: [0.0, 10.0, 12.0, 14.0, 11.0, 13.0], 2: [0.0, 9.0, 13.0, 10.0, 12.0, 8.0]}
    result = search(
        "prefill_chunk", "b", [1, 2], timed_by(jittery, clock, []), default=1, rounds=5,
        timer=clock,
    )  # fmt: skip
    assert result.verdict.best == 2 and not result.verdict.accepted
    entry = result.entry()
    assert (entry.value, entry.default) == (1, 1)
    assert entry.median_seconds == entry.default_median_seconds == 12.0

    clear = {1: [0.0, 10.0, 12.0, 14.0, 11.0, 13.0], 2: [0.0, 3.0, 3.1, 2.9, 3.0, 3.0]}
    result = search(
        "prefill_chunk", "b", [1, 2], timed_by(clear, clock, []), default=1, rounds=5,
        timer=clock,
    )  # fmt: skip
    assert result.verdict.accepted
    entry = result.entry()
    assert (entry.value, entry.default, entry.median_seconds) == (2, 1, 3.0)


def test_a_search_needs_the_default_among_its_candidates():
    with pytest.raises(ValueError, match="default 3 must be among the candidates"):
        search("prefill_chunk", "b", [1, 2], lambda _: None, default=3, rounds=2)
