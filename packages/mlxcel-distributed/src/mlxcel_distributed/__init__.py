"""mlxcel distributed: tensor-parallel inference on `mx.distributed`.

Rank 0 runs the engine and sends each step to the other ranks, which run the same forward
passes over their shards of the model (`lockstep`); `local_ranks` starts a group on one
machine, `group` joins one however it was started. Disaggregated prefill runs prompts on a
prefill rank (`disaggregate_prefill`) and hands their KV blocks to rank 0's engine
(`disaggregate_front`, `kv_transfer`).
"""

from mlxcel_distributed.disaggregate_front import PrefillClient, make_prefill_client_factory
from mlxcel_distributed.disaggregate_prefill import PrefillWorker, serve_prefills
from mlxcel_distributed.group import GroupError, join_group
from mlxcel_distributed.kv_transfer import BlockLayout, block_layout, pack_blocks, unpack_blocks
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
    "BlockLayout",
    "GroupError",
    "KVPlan",
    "LocalRanks",
    "LockstepError",
    "LockstepRunner",
    "Message",
    "PrefillClient",
    "PrefillWorker",
    "Shutdown",
    "StepChannel",
    "StepMessage",
    "TensorParallelError",
    "block_layout",
    "check_tp_size",
    "decode_message",
    "encode_message",
    "follow_steps",
    "join_group",
    "make_lockstep_runner_factory",
    "make_prefill_client_factory",
    "pack_blocks",
    "serve_prefills",
    "shard_model",
    "signal_ready",
    "unpack_blocks",
    "valid_tp_sizes",
]
