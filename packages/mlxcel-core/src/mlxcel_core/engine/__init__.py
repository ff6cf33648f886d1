"""The engine boundary: requests in, per-request outputs out, on one inference thread.

It knows nothing of HTTP or tokenizers: callers pass token ids, a detokenizer and sampling
settings, and read `EngineOutput`s from the sink they supplied. Inside, a continuous-batching
loop schedules every request over a paged KV cache.
"""

from mlxcel_core.adapters import AdapterScales, RowAdapterScales
from mlxcel_core.engine.config import EngineConfig, InsufficientMemoryError
from mlxcel_core.engine.core import EngineCore, RunnerFactory, Submission
from mlxcel_core.engine.engine import Engine
from mlxcel_core.engine.output_queue import OutputQueue
from mlxcel_core.engine.remote_prefill import (
    PrefilledKV,
    PrefillJob,
    RemotePrefill,
    RemotePrefillFactory,
)
from mlxcel_core.engine.request import (
    EngineClosedError,
    EngineError,
    EngineOutput,
    EngineOverloadedError,
    EngineRequest,
    EngineUnavailableError,
    ImagesNotSupportedError,
    OutputSink,
    RequestCancelledError,
    RequestHandle,
)
from mlxcel_core.engine.runner import ModelRunner, RowInput
from mlxcel_core.engine.scheduler import SchedulerConfig
from mlxcel_core.engine.stats import EngineStats, SlotState

__all__ = [
    "AdapterScales",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineCore",
    "EngineError",
    "EngineOutput",
    "EngineOverloadedError",
    "EngineRequest",
    "EngineStats",
    "EngineUnavailableError",
    "ImagesNotSupportedError",
    "InsufficientMemoryError",
    "ModelRunner",
    "OutputQueue",
    "OutputSink",
    "PrefillJob",
    "PrefilledKV",
    "RemotePrefill",
    "RemotePrefillFactory",
    "RequestCancelledError",
    "RequestHandle",
    "RowAdapterScales",
    "RowInput",
    "RunnerFactory",
    "SchedulerConfig",
    "SlotState",
    "Submission",
]
