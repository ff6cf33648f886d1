"""What each rank runs in the lockstep (`lockstep`): rank 0's model runner, built by the
engine, and the followers' loop. Over a pipeline both are the stage runners of
`pipeline_runner`, which keep one step per stage in flight.
"""

from __future__ import annotations

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.block_groups import BlockGroups
from mlxcel_core.cache.layout import model_cache_layout
from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import EngineConfig, ModelRunner, RunnerFactory
from mlxcel_core.engine.config import make_kv_storage, profile_largest_step
from mlxcel_core.errors import MlxcelError
from mlxcel_core.language_model import LanguageModel
from mlxcel_distributed.lockstep import LockstepRunner, asks_for_reports, evaluate_step
from mlxcel_distributed.pipeline_runner import PipelineRunner, StageRunner
from mlxcel_distributed.pipeline_stage import PipelineStage
from mlxcel_distributed.stage_guard import StageGuard, timed
from mlxcel_distributed.stage_reports import StageReport
from mlxcel_distributed.step_channel import Channel
from mlxcel_distributed.step_messages import KVPlan, Shutdown, StepMessage


class LockstepError(MlxcelError, RuntimeError):
    """A follower received a message out of order (rank 0 and it have diverged)."""


def make_lockstep_runner_factory(
    channel: Channel, guard: StageGuard | None = None
) -> RunnerFactory:
    """The `Engine(make_runner=...)` factory of rank 0: it sends the KV plan (the blocks
    the engine sized each block group of its cache to, the groups' windows, and whether
    the other ranks report their steps: `asks_for_reports`) and returns a `LockstepRunner`
    under `guard` (None: unguarded), or for a pipeline stage a `PipelineRunner`.

    The factory raises `ValueError` for a model with unfused LoRA adapters.
    """

    def make_runner(
        model: LanguageModel, storage: PagedKVStorage, adapters: RowAdapterScales | None
    ) -> ModelRunner:
        if adapters is not None:
            raise ValueError("lockstep ranks do not support unfused LoRA adapters")
        channel.send(KVPlan(storage.max_blocks, storage.windows, reports=asks_for_reports(guard)))
        if isinstance(model, PipelineStage):
            return PipelineRunner(model, storage, channel, guard)
        return LockstepRunner(model, storage, channel, guard)

    return make_runner


def follow_steps(model: LanguageModel, config: EngineConfig, channel: Channel) -> int:
    """A follower's whole engine life: replay rank 0's profile pass, build the KV pools it
    planned, then run each step it sends until it shuts down, reporting each step's
    measurements back (`stage_reports`) when the plan asks for them.

    Args:
        model: this rank's part of the model (a shard, or a `PipelineStage`).
        config: the engine settings rank 0 runs with (prefill chunk, block size, cache types).
        channel: the group's step channel.

    Returns:
        The number of steps run.

    Raises:
        LockstepError: a message came out of order.
    """
    profile = profile_largest_step(config, model)
    plan = channel.receive()
    if isinstance(plan, Shutdown):
        return 0
    if not isinstance(plan, KVPlan):
        raise LockstepError(f"expected the KV plan from rank 0, got {type(plan).__name__}")
    groups = BlockGroups(plan.windows)
    storage = make_kv_storage(
        config,
        profile,
        plan.num_blocks,
        windows=groups.windows,
        layer_groups=groups.layer_groups(model_cache_layout(model)),
    )
    report = channel.report if plan.reports else None
    runner = (
        StageRunner(model, storage, report)
        if isinstance(model, PipelineStage)
        else ModelRunner(model, storage)
    )
    num_steps = 0
    while not isinstance(message := channel.receive(), Shutdown):
        if not isinstance(message, StepMessage):
            raise LockstepError(f"expected a step from rank 0, got {type(message).__name__}")
        lap = timed()
        runner.prepare_storage(message.num_blocks, message.copies)
        evaluate_step(runner.run(message.rows), len(message.rows), storage)
        num_steps += 1
        # A stage reports from within its step, as its report may travel with its output.
        if report is not None and not isinstance(runner, StageRunner):
            report(StageReport(num_steps, lap(), 0))
    return num_steps
