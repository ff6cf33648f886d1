"""mlxcel distributed: tensor- and pipeline-parallel inference on `mx.distributed`.

Rank 0 runs the engine and sends each step to the other ranks, which run the same forward
passes over their part of the model (`lockstep`, `lockstep_roles`): a shard of every layer
(`tensor_parallel`) or a stage of consecutive layers (`pipeline_stage`), whose runners
keep one step per stage in flight (`pipeline_runner`); `local_ranks`
starts a group on one machine, `group` joins one however it was started.
`stage_guard` holds rank 0's steps to the stage timeout (`watchdog`), records the
group's faults (`stage_health`) and measures the steps (`stage_metrics`), the other
ranks reporting their own (`stage_reports`). Disaggregated
prefill runs prompts on a prefill rank (`disaggregate_prefill`) and hands their KV blocks
to rank 0's engine (`disaggregate_front`, `kv_transfer`), each job held to a deadline by
the same watchdog, and measured (`disaggregate_metrics`).
"""

from mlxcel_distributed.disaggregate_front import (
    PREFILL_RANK,
    PrefillClient,
    PrefillDeadline,
    make_prefill_client_factory,
)
from mlxcel_distributed.disaggregate_metrics import PrefillMetrics, PrefillMetricsSnapshot
from mlxcel_distributed.disaggregate_prefill import PrefillWorker, serve_prefills
from mlxcel_distributed.group import GroupError, join_group
from mlxcel_distributed.kv_transfer import BlockLayout, block_layout, pack_blocks, unpack_blocks
from mlxcel_distributed.local_ranks import (
    READY_FD_VARIABLE,
    LocalRanks,
    local_backend,
    signal_ready,
    visible_cuda_devices,
)
from mlxcel_distributed.lockstep import LockstepRunner
from mlxcel_distributed.lockstep_roles import (
    LockstepError,
    follow_steps,
    make_lockstep_runner_factory,
)
from mlxcel_distributed.pipeline_runner import PipelineRunner, StageRunner
from mlxcel_distributed.pipeline_stage import (
    PIPELINE_FAMILIES,
    PipelineStage,
    StagePass,
    make_pipeline_stage,
)
from mlxcel_distributed.stage_guard import StageGuard
from mlxcel_distributed.stage_health import StageFault, StageHealth
from mlxcel_distributed.stage_metrics import Histogram, StageMetrics, StageMetricsSnapshot
from mlxcel_distributed.stage_reports import StageReport
from mlxcel_distributed.step_channel import Channel, PipelineChannel, Sent, StepChannel
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
from mlxcel_distributed.watchdog import StepWatchdog

__all__ = [
    "PIPELINE_FAMILIES",
    "PREFILL_RANK",
    "READY_FD_VARIABLE",
    "BlockLayout",
    "Channel",
    "GroupError",
    "Histogram",
    "KVPlan",
    "LocalRanks",
    "LockstepError",
    "LockstepRunner",
    "Message",
    "PipelineChannel",
    "PipelineRunner",
    "PipelineStage",
    "PrefillClient",
    "PrefillDeadline",
    "PrefillMetrics",
    "PrefillMetricsSnapshot",
    "PrefillWorker",
    "Sent",
    "Shutdown",
    "StageFault",
    "StageGuard",
    "StageHealth",
    "StageMetrics",
    "StageMetricsSnapshot",
    "StagePass",
    "StageReport",
    "StageRunner",
    "StepChannel",
    "StepMessage",
    "StepWatchdog",
    "TensorParallelError",
    "block_layout",
    "check_tp_size",
    "decode_message",
    "encode_message",
    "follow_steps",
    "join_group",
    "local_backend",
    "make_lockstep_runner_factory",
    "make_pipeline_stage",
    "make_prefill_client_factory",
    "pack_blocks",
    "serve_prefills",
    "shard_model",
    "signal_ready",
    "unpack_blocks",
    "valid_tp_sizes",
    "visible_cuda_devices",
]
