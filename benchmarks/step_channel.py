"""Cost of one collective on a local ring group: the step channel's all-sum frame, rank 0
sending the frame to each rank, and the all-sum of one token's hidden state that every
sharded layer ends in.

Starts `--ranks` local ranks over loopback (as `--tp` does) and prints, on rank 0, the
median wall time of each operation over `--repeats` rounds (each round evaluated alone).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        uv run python benchmarks/step_channel.py --ranks 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import mlx.core as mx

from mlxcel_distributed import LocalRanks, join_group
from mlxcel_distributed.step_channel import FRAME_INTS

HIDDEN_SIZE = 576  # SmolLM2-135M


def _median_ms(operation, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        operation()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    local = None
    if "MLX_RANK" not in os.environ:

        def fail(rank: int, code: int) -> None:
            print(f"rank {rank} exited with code {code}", file=sys.stderr)
            os._exit(1)

        local = LocalRanks(
            [sys.executable, *sys.argv], args.ranks, environ=os.environ, on_exit=fail
        )
        os.environ.update(local.environment)
    group = join_group(args.ranks, backend="ring")
    rank = group.rank()
    frame = mx.zeros((FRAME_INTS,), dtype=mx.int32)
    hidden = mx.zeros((1, 1, HIDDEN_SIZE), dtype=mx.float32)

    def all_sum_frame() -> None:
        mx.eval(mx.distributed.all_sum(frame, group=group))

    def send_frame() -> None:
        if rank == 0:
            mx.eval([mx.distributed.send(frame, dst, group=group) for dst in range(1, args.ranks)])
        else:
            mx.eval(mx.distributed.recv_like(frame, 0, group=group))

    def all_sum_hidden() -> None:
        mx.eval(mx.distributed.all_sum(hidden, group=group))

    results = {
        "all-sum of the step frame (int32 x 256)": _median_ms(all_sum_frame, args.repeats),
        "send of the step frame to each rank": _median_ms(send_frame, args.repeats),
        f"all-sum of one token's hidden state (f32 x {HIDDEN_SIZE})": _median_ms(
            all_sum_hidden, args.repeats
        ),
    }
    if rank == 0:
        for name, ms in results.items():
            print(f"{args.ranks} ranks, {name}: {ms:.3f} ms (median of {args.repeats})")
    if local is not None:
        local.stop(timeout=30)


if __name__ == "__main__":
    main()
