"""One rank of a group exchanging step messages and stage reports over a real channel.

Started by tests/distributed/test_channel_reports.py with MLX_RANK and MLX_HOSTFILE set
for the ring backend:

    python channel_rank.py OUTPUT

Over a tensor-parallel channel (`tp`), then a pipeline channel (`pp`) of the same group,
rank 0 sends `NUM_STEPS` step messages, then the shutdown, and writes to OUTPUT (JSON, by
kind) the reports it got back after each: with each message's all-sum (`tp`), or from the
last rank after each step (`pp`, where the last stage sends them with the step's logits;
here alone). Every other rank checks each message it receives and reports its step.
"""

from __future__ import annotations

import argparse
import json
import sys

import mlx.core as mx
import numpy as np

from mlxcel_core.engine import RowInput
from mlxcel_distributed import PipelineChannel, Shutdown, StageReport, StepChannel, StepMessage
from mlxcel_distributed.stage_reports import read_reports

NUM_STEPS = 3


def message(step: int) -> StepMessage:
    # Step 2 carries a prompt longer than the first frame, so it takes a second one.
    tokens = list(range(600 if step == 2 else 3))
    return StepMessage((step,), (), (RowInput(tokens, ([step],), 0, 1),))


def report(rank: int, step: int) -> StageReport:
    """Rank `rank`'s report of `step`: its bytes past what one int32 holds."""
    return StageReport(step, rank / 100 + step / 1000, 10**10 * rank + step)


def as_lists(reports: dict[int, StageReport]) -> dict[str, list[float]]:
    return {str(rank): [r.steps, r.seconds, r.sent_bytes] for rank, r in reports.items()}


def exchange(group: mx.distributed.Group, kind: str) -> list | None:
    """One channel's exchange: rank 0's reports by step; `None` on a follower that got a
    message other than the one sent."""
    channel = StepChannel(group) if kind == "tp" else PipelineChannel(group)
    if group.rank() == 0:
        received = []
        for step in range(1, NUM_STEPS + 1):
            reports = channel.send(message(step)).reports
            if kind == "pp":
                last = group.size() - 1
                region = mx.distributed.recv((channel.region_ints,), mx.int32, last, group=group)
                reports = read_reports(np.array(region))
            received.append(as_lists(reports))
        received.append(as_lists(channel.send(Shutdown()).reports))
        return received
    step = 0
    while not isinstance(received_message := channel.receive(), Shutdown):
        step += 1
        if received_message != message(step):
            print(f"rank {group.rank()}: {kind} step {step} arrived as {received_message}")
            return None
        returned = channel.report(report(group.rank(), step))
        if returned is not None:
            mx.eval(mx.distributed.send(mx.array(returned), 0, group=group))
    return []


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    args = parser.parse_args()
    group = mx.distributed.init(backend="ring", strict=True)
    received = {}
    for kind in ("tp", "pp"):
        received[kind] = exchange(group, kind)
        if received[kind] is None:
            return 1
    if group.rank() == 0:
        with open(args.output, "w") as file:
            json.dump(received, file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
