"""The followers' own measurements of their steps, on their way back to rank 0.

Each rank > 0 reports its latest step: how many steps it has run, its own time on that
step, and the bytes it sent on to the next rank. Reports ride in a region of ints at the
end of the step channel's first frame, `REPORT_INTS` per follower: a tensor-parallel
follower adds its report into its slot of the all-sum that brings it the next message
(rank 0 reads the summed frame); a pipeline's middle rank writes its report into the frame
it passes on, and the last rank appends the region, its own report added, to the step's
logits it sends rank 0. No report takes a transfer of its own. A tensor-parallel
follower's report, and a pipeline's middle rank's, reach rank 0 one step late.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Per follower: steps run, microseconds of the latest, and its bytes sent in two halves (a
# step's logits for every position of a long prefill can pass what one int32 holds).
REPORT_INTS = 4
_HALF = 1 << 31
_MAX_MICROSECONDS = _HALF - 1


@dataclass(frozen=True)
class StageReport:
    """One rank's own measurements of its latest step.

    Attributes:
        steps: steps the rank has run, this one included (>= 1); names the step measured.
        seconds: the rank's own time on the step: for a tensor-parallel rank, from the
            step's message to its logits and KV writes evaluated (collectives included);
            for a pipeline stage, from its input hidden states received to its output
            evaluated, before it sends it on.
        sent_bytes: bytes the rank sent to the next stage for the step (a pipeline's hidden
            states, or the last stage's logits to rank 0); 0 for a tensor-parallel rank.
    """

    steps: int
    seconds: float
    sent_bytes: int


def region_size(group_size: int) -> int:
    """The ints of the report region of a group of `group_size` ranks."""
    return REPORT_INTS * (group_size - 1)


def write_report(region: np.ndarray, rank: int, report: StageReport) -> None:
    """Put `report` in follower `rank`'s slot of `region` (int32, `region_size` long)."""
    microseconds = min(max(round(report.seconds * 1e6), 0), _MAX_MICROSECONDS)
    high, low = divmod(report.sent_bytes, _HALF)
    start = REPORT_INTS * (rank - 1)
    region[start : start + REPORT_INTS] = (report.steps, microseconds, high, low)


def read_reports(region: np.ndarray) -> dict[int, StageReport]:
    """The reports in `region`, by rank; a slot whose rank has run no step yet is left out."""
    reports = {}
    for start in range(0, len(region), REPORT_INTS):
        steps, microseconds, high, low = (int(i) for i in region[start : start + REPORT_INTS])
        if steps > 0:
            rank = start // REPORT_INTS + 1
            reports[rank] = StageReport(steps, microseconds / 1e6, high * _HALF + low)
    return reports
