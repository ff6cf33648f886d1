"""The engine boundary: requests in, per-request outputs out, on one inference thread.

It knows nothing of HTTP or tokenizers: callers pass token ids, a detokenizer and sampling
settings, and read `EngineOutput`s from the sink they supplied.
"""

from mlxcel_core.engine.engine import Engine, EngineConfig
from mlxcel_core.engine.output_queue import OutputQueue
from mlxcel_core.engine.request import (
    EngineClosedError,
    EngineError,
    EngineOutput,
    EngineOverloadedError,
    EngineRequest,
    OutputSink,
    RequestCancelledError,
    RequestHandle,
)

__all__ = [
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineError",
    "EngineOutput",
    "EngineOverloadedError",
    "EngineRequest",
    "OutputQueue",
    "OutputSink",
    "RequestCancelledError",
    "RequestHandle",
]
