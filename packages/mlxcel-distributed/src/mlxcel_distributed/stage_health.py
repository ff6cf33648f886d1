"""Whether every rank of the group still answers, as rank 0 sees it.

A rank's fault is final: MLX cannot re-form a group inside a running process, so once a
rank is gone the group stays degraded until the command is restarted. The first fault
reported wins; later ones (the same failure seen from another side) are dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StageFault:
    """Why the group can no longer run steps.

    Attributes:
        rank: the rank at fault, or None when rank 0 cannot tell which one (a collective
            failed, or a step overran the stage timeout).
        reason: what happened, in a few words (`exited with code -9`).
    """

    rank: int | None
    reason: str

    @property
    def summary(self) -> str:
        """The fault in a few words: `rank 2 exited with code -9`."""
        return self.reason if self.rank is None else f"rank {self.rank} {self.reason}"

    @property
    def message(self) -> str:
        """One line for clients."""
        return f"a rank of the model is unavailable: {self.summary}; restart the server"


class StageHealth:
    """The group's fault, once there is one; safe to use from any thread."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._fault: StageFault | None = None
        self._listeners: list[Callable[[StageFault], None]] = []

    @property
    def fault(self) -> StageFault | None:
        """The first fault reported, or None while every rank answers."""
        return self._fault

    def add_listener(self, listener: Callable[[StageFault], None]) -> None:
        """Call `listener` with the fault once it is reported (at once if it already is)."""
        with self._condition:
            fault = self._fault
            if fault is None:
                self._listeners.append(listener)
        if fault is not None:
            listener(fault)

    def report(self, fault: StageFault) -> None:
        """Record `fault` unless one is already recorded, and tell the listeners."""
        with self._condition:
            if self._fault is not None:
                return
            self._fault = fault
            listeners, self._listeners = self._listeners, []
            self._condition.notify_all()
        for listener in listeners:
            listener(fault)

    def wait_for_fault(self, timeout: float) -> StageFault | None:
        """The fault, waiting up to `timeout` seconds for one to be reported."""
        with self._condition:
            self._condition.wait_for(lambda: self._fault is not None, timeout)
            return self._fault
