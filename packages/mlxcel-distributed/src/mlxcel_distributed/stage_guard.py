"""What rank 0 wraps around each lockstep step: refuse it once the group is degraded,
time it, hold it to the stage timeout, and turn a failed collective into a fault.

Measured on the ring backend over loopback with 3 ranks: when a rank is killed while the
others wait in one all-sum, their all-sum raises `RuntimeError` ("connection to a peer was
lost") within a fraction of a second, and so does any collective started later. But with
many all-sums queued in one evaluation (a sharded forward pass: 60 for SmolLM2), a killed
rank can leave the others blocked for good, as a stopped (SIGSTOP) one always does; MLX
gives no way to interrupt them, hence the stage timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from mlxcel_core.engine import EngineUnavailableError
from mlxcel_distributed.stage_health import StageFault, StageHealth
from mlxcel_distributed.stage_metrics import StageMetrics
from mlxcel_distributed.watchdog import StepWatchdog

# How long a failed collective waits for a process watcher to name the rank that died
# (a local rank's exit is seen within milliseconds), before reporting an unnamed fault.
NAMING_GRACE_SECONDS = 1.0


class StageGuard:
    """Rank 0's health, metrics and stage timeout for the lockstep steps.

    Args:
        health: the group's health; its fault ends every later step at once.
        metrics: where step times and step-channel bytes are recorded.
        watchdog: holds each step to the stage timeout; None for no timeout.
        reports: whether to ask the other ranks for their own step times
            (`stage_reports`); worth their small cost per step only where the metrics are
            read.
    """

    def __init__(
        self,
        health: StageHealth,
        metrics: StageMetrics,
        watchdog: StepWatchdog | None = None,
        *,
        reports: bool = True,
    ) -> None:
        self.health = health
        self.metrics = metrics
        self.reports = reports
        self._watchdog = watchdog
        health.add_listener(lambda fault: metrics.record_down(fault.rank))

    def check(self) -> None:
        """Raises `EngineUnavailableError` naming the fault, once there is one."""
        fault = self.health.fault
        if fault is not None:
            raise EngineUnavailableError(fault.message)

    @contextmanager
    def step(self) -> Iterator[StageMetrics]:
        """Run one step's collectives under the stage timeout; yields the metrics to
        record the step's measurements in.

        Raises:
            EngineUnavailableError: a collective of the step failed (a rank is gone).
        """
        watching = nullcontext() if self._watchdog is None else self._watchdog.step()
        with watching:
            try:
                yield self.metrics
            # The ring backend's error for a lost peer; the group cannot run steps again.
            except RuntimeError as error:
                fault = self.health.wait_for_fault(NAMING_GRACE_SECONDS)
                if fault is None:
                    self.health.report(StageFault(None, f"a collective failed: {error}"))
                self.check()
                raise


def timed() -> Callable[[], float]:
    """A stopwatch: each call returns the seconds since the previous one (or its start)."""
    last = time.perf_counter()

    def lap() -> float:
        nonlocal last
        now = time.perf_counter()
        seconds, last = now - last, now
        return seconds

    return lap
