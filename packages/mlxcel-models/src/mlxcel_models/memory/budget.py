"""The memory a model may take on this device: what is free now, within the engine's share.

The engine may use `--gpu-memory-utilization` of the device's memory (`engine/memory.py`);
the budget is that, capped by what the device can give now: on the CPU the RAM the
operating system reports available, on Metal the recommended working set.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import psutil

from mlxcel_core.engine.memory import device_memory_bytes


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes a model may take.

    Attributes:
        device_bytes: the device's memory (RAM on the CPU), as the engine counts it.
        available_bytes: what the device can give now (free RAM, or Metal's recommended
            working set; the device's memory on CUDA).
        utilization: the engine's share of `device_bytes`, in (0, 1].

    Raises:
        ValueError: `utilization` is outside (0, 1] or a byte count is negative.
    """

    device_bytes: int
    available_bytes: int
    utilization: float

    def __post_init__(self) -> None:
        if not 0.0 < self.utilization <= 1.0:
            raise ValueError(f"utilization must be in (0, 1], got {self.utilization}")
        if min(self.device_bytes, self.available_bytes) < 0:
            raise ValueError("device_bytes and available_bytes must be >= 0")

    @property
    def usable_bytes(self) -> int:
        """The engine's share of the device, or what is available if that is less."""
        return min(int(self.device_bytes * self.utilization), self.available_bytes)


def available_memory_bytes() -> int:
    """What the default device can give now (see `MemoryBudget.available_bytes`)."""
    device = mx.default_device()
    if device.type == mx.DeviceType.cpu:
        return psutil.virtual_memory().available
    working_set = mx.device_info().get("max_recommended_working_set_size")
    if isinstance(working_set, int) and working_set > 0:
        return working_set
    return device_memory_bytes()


def device_memory_budget(utilization: float) -> MemoryBudget:
    """The default device's budget for an engine given `utilization` of its memory.

    Raises:
        ValueError: `utilization` is outside (0, 1].
    """
    return MemoryBudget(device_memory_bytes(), available_memory_bytes(), utilization)
