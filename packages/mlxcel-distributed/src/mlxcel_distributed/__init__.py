"""mlxcel distributed: tensor-parallel inference on `mx.distributed`.

Rank 0 runs the engine and sends each step to the other ranks, which run the same forward
passes over their shards of the model (`lockstep`); `local_ranks` starts a group on one
machine, `group` joins one however it was started.
"""

from mlxcel_distributed.group import GroupError, join_group
from mlxcel_distributed.local_ranks import READY_FD_VARIABLE, LocalRanks, signal_ready
from mlxcel_distributed.lockstep import (
    LockstepError,
    LockstepRunner,
    follow_steps,
    make_lockstep_runner_factory,
)
from mlxcel_distributed.step_channel import StepChannel
from mlxcel_distributed.step_messages import (
    KVPlan,
    Message,
    Shutdown,
    StepMessage,
    decode_message,
    encode_message,
)
from mlxcel_distributed.tensor_parallel import (
    TensorParallelError,
    check_tp_size,
    shard_model,
    valid_tp_sizes,
)

__all__ = [
    "READY_FD_VARIABLE",
    "GroupError",
    "KVPlan",
    "LocalRanks",
    "LockstepError",
    "LockstepRunner",
    "Message",
    "Shutdown",
    "StepChannel",
    "StepMessage",
    "TensorParallelError",
    "check_tp_size",
    "decode_message",
    "encode_message",
    "follow_steps",
    "join_group",
    "make_lockstep_runner_factory",
    "shard_model",
    "signal_ready",
    "valid_tp_sizes",
]
