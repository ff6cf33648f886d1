"""The prefill rank of disaggregated prefill: it computes prompts' KV and sends it back.

It owns a model runner over its own paged KV cache, with prefix caching, so a prompt it has
seen before (a shared system prompt) is computed only past the cached prefix. Each job's
prompt runs in chunks of the engine's `max_prefill_chunk` tokens; the blocks the front asked
for are then read, packed (`kv_transfer`) and sent in one message, and the sequence's blocks
are freed (full ones stay in the prefix cache). Logits are never evaluated here: the front
computes the prompt's last token and samples.
"""

from __future__ import annotations

import time

import mlx.core as mx

from mlxcel_core.cache.paged import InvariantError, KVCacheManager
from mlxcel_core.engine import EngineConfig, ModelRunner, PrefillJob, RowInput
from mlxcel_core.engine.config import make_kv_storage, plan_kv_blocks, profile_largest_step
from mlxcel_core.engine.remote_prefill import returned_block_ids
from mlxcel_core.language_model import LanguageModel
from mlxcel_distributed.disaggregate_messages import receive_job, send_kv, send_ready
from mlxcel_distributed.kv_transfer import pack_blocks

FRONT_RANK = 0
_SEQ_ID = 0  # one job at a time


class PrefillWorker:
    """Computes prompts' KV in its own paged cache.

    Args:
        model: the language model (the same weights as the front's).
        config: the front's engine settings: block size, cache types, prefill chunk, KV
            budget and prefix caching apply here too.

    Raises:
        InsufficientMemoryError: the KV budget cannot hold one sequence of the context size.
        ValueError: the model stores no keys and values.
    """

    def __init__(self, model: LanguageModel, config: EngineConfig) -> None:
        chunk = config.scheduler.max_prefill_chunk
        profile = profile_largest_step(config, model)
        num_blocks = plan_kv_blocks(config, profile)
        self.storage = make_kv_storage(config, profile, num_blocks)
        self._kv = KVCacheManager(
            num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self._runner = ModelRunner(model, self.storage)
        self._chunk = chunk

    def prefill(self, job: PrefillJob) -> list[mx.array]:
        """Compute the KV of `job.token_ids` and read the blocks the job asks for.

        Returns:
            `PagedKVStorage.read_blocks` of those blocks, evaluated.

        Raises:
            InvariantError: the cache cannot hold the prompt (it holds one sequence of the
                context size, and only one sequence at a time is here).
            ValueError: the job asks for blocks past the prompt's.
        """
        tokens = job.token_ids
        num_cached = self._kv.admit(_SEQ_ID, tokens, min(self._chunk, len(tokens)))
        if num_cached is None:
            raise InvariantError(f"no KV blocks for a prompt of {len(tokens)} tokens")
        try:
            num_computed = num_cached
            while num_computed < len(tokens):
                num_new = min(self._chunk, len(tokens) - num_computed)
                if not self._kv.allocate_slots(_SEQ_ID, num_computed, num_new):
                    raise InvariantError(f"no KV blocks for a prompt of {len(tokens)} tokens")
                self._runner.prepare_storage(
                    self._kv.materialized_blocks, self._kv.take_block_copies()
                )
                row = RowInput(
                    tokens[num_computed : num_computed + num_new],
                    self._kv.block_tables(_SEQ_ID),
                    num_computed,
                )
                self._runner.run([row])
                mx.eval(self.storage.arrays())
                num_computed += num_new
                self._kv.commit(_SEQ_ID, tokens, num_computed)
            table = self._kv.block_table(_SEQ_ID)
            if job.first_block + job.num_blocks > len(table):
                raise ValueError(
                    f"the job asks for blocks up to {job.first_block + job.num_blocks}, "
                    f"the prompt has {len(table)}"
                )
            contents = self.storage.read_blocks(returned_block_ids(table, job))
            mx.eval(contents)
            return contents
        finally:
            self._kv.free(_SEQ_ID)


def serve_prefills(model: LanguageModel, config: EngineConfig, group: mx.distributed.Group) -> int:
    """The prefill rank's whole life: build its KV cache, tell the front it takes jobs,
    then compute each job the front sends and send its KV back, with the time computing it
    took, until the front shuts down.

    Returns:
        The number of prompts prefilled.

    Raises:
        InsufficientMemoryError: the KV budget cannot hold one sequence of the context size.
        ValueError: a message from the front is malformed.
    """
    worker = PrefillWorker(model, config)
    send_ready(FRONT_RANK, group)
    num_jobs = 0
    while (job := receive_job(FRONT_RANK, group)) is not None:
        start = time.perf_counter()
        contents = worker.prefill(job)
        send_kv(pack_blocks(contents), time.perf_counter() - start, FRONT_RANK, group)
        num_jobs += 1
    return num_jobs
