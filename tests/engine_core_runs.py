"""Stepping an `EngineCore` through scripted arrivals, with async scheduling on and off.

Requests arrive, and are cancelled, at fixed steps, so each run is deterministic;
`assert_same_outputs` runs both loops and compares each request's outputs token by token:
token ids, text, finish reasons and errors exactly, log probabilities to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mlxcel_core.engine import (
    EngineConfig,
    EngineCore,
    EngineOutput,
    EngineRequest,
    OutputQueue,
    RequestHandle,
    SchedulerConfig,
    Submission,
)
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams, TokenConstraint

BLOCK_SIZE = 4
CONTEXT_SIZE = 64
# On a GPU a row's log probabilities depend, in their last bits, on how many rows share its
# step (the products' tactic changes with the row count), and the overlapped loop's steps
# may carry a finished row's extra token that the synchronous loop's do not.
LOGPROB_TOLERANCE = 1e-5
GREEDY = SamplingParams(temperature=0.0)


class LetterDetokenizer:
    """One letter per token, so that stop strings have text to match."""

    def add_token(self, token_id: int) -> str:
        return chr(ord("a") + token_id % 26)

    def finalize(self) -> str:
        return ""


@dataclass(frozen=True)
class Arrival:
    """Requests submitted together as one group, before step `at_step`."""

    requests: tuple[EngineRequest, ...]
    at_step: int = 0
    cancel_at_step: int | None = None


@dataclass
class Run:
    outputs: dict[int, list[EngineOutput]] = field(default_factory=dict)
    num_steps: int = 0
    num_preemptions: int = 0


def request(
    prompt: Sequence[int],
    *,
    max_tokens: int = 12,
    sampling: SamplingParams = GREEDY,
    index: int = 0,
    stop_strings: tuple[str, ...] = (),
    stop_token_ids: frozenset[int] = frozenset(),
    num_top_logprobs: int | None = None,
    constraint: TokenConstraint | None = None,
    context_size: int = CONTEXT_SIZE,
) -> EngineRequest:
    generation = GenerationConfig(
        context_size=context_size,
        max_tokens=max_tokens,
        stop_strings=stop_strings,
        stop_token_ids=stop_token_ids,
        num_top_logprobs=num_top_logprobs,
    )
    return EngineRequest(
        prompt_ids=tuple(prompt),
        sampling=sampling,
        generation=generation,
        detokenizer=LetterDetokenizer(),
        index=index,
        constraint=constraint,
    )


def prompt(first: int, length: int, vocab_size: int = 256) -> list[int]:
    """`length` token ids from 3 to `vocab_size` - 4, no two prompts of other `first` alike."""
    return [(first + 7 * i) % (vocab_size - 6) + 3 for i in range(length)]


def config(async_scheduling: bool, **kwargs) -> EngineConfig:
    settings = {
        "scheduler": SchedulerConfig(max_num_seqs=4, max_prefill_chunk=8),
        "context_size": CONTEXT_SIZE,
        "block_size": BLOCK_SIZE,
        "num_kv_blocks": 64,
        "async_scheduling": async_scheduling,
    }
    return EngineConfig(**{**settings, **kwargs})


def run(model: LanguageModel, engine_config: EngineConfig, arrivals: Sequence[Arrival]) -> Run:
    """Step a core until every request ended; outputs by group number, then index."""
    core = EngineCore(model, engine_config)
    sinks = [OutputQueue() for _ in arrivals]
    handles = [RequestHandle(number) for number in range(len(arrivals))]
    result = Run()
    seq_ids = iter(range(1000))
    step = 0
    while step < 500:
        for number, arrival in enumerate(arrivals):
            if arrival.at_step == step:
                firsts: dict = {}
                for item in arrival.requests:
                    submission = Submission(next(seq_ids), item, sinks[number], handles[number])
                    core.admit(submission, firsts)
            if arrival.cancel_at_step == step:
                handles[number].cancel()
        core.end_cancelled()
        pending_arrivals = any(arrival.at_step > step for arrival in arrivals)
        if not core.has_work and not pending_arrivals:
            break
        if core.has_work:
            core.step()
        step += 1
    result.num_steps = step
    result.num_preemptions = core.stats().num_preemptions
    for number, sink in enumerate(sinks):
        while True:
            try:
                output = sink.get(timeout=0)
            except Exception:
                break
            key = 100 * number + output.index
            result.outputs.setdefault(key, []).append(output)
    return result


def comparable(outputs: Sequence[EngineOutput]) -> list[tuple]:
    """What must match exactly between the loops: all but the timings, the random seeds
    that unseeded requests draw and the log probabilities' values (`logprob_values`)."""
    rows = []
    for output in outputs:
        logprobs = output.logprobs
        ids = None if logprobs is None else (logprobs.token_id, logprobs.top_ids)
        error = None if output.error is None else type(output.error)
        rows.append((output.token_id, output.text, output.finish_reason, error, ids))
    return rows


def logprob_values(outputs: Sequence[EngineOutput]) -> list[float]:
    """Every log probability the outputs carry, in order."""
    return [
        value
        for output in outputs
        if output.logprobs is not None
        for value in (output.logprobs.logprob, *output.logprobs.top_logprobs)
    ]


def assert_same_outputs(
    model: LanguageModel, arrivals: Sequence[Arrival], **settings
) -> tuple[Run, Run]:
    """Both runs, synchronous first, after checking that their outputs match."""
    synchronous = run(model, config(False, **settings), arrivals)
    overlapped = run(model, config(True, **settings), arrivals)
    assert synchronous.outputs.keys() == overlapped.outputs.keys()
    for key in synchronous.outputs:
        assert comparable(overlapped.outputs[key]) == comparable(synchronous.outputs[key]), key
        np.testing.assert_allclose(
            logprob_values(overlapped.outputs[key]),
            logprob_values(synchronous.outputs[key]),
            rtol=0,
            atol=LOGPROB_TOLERANCE,
            err_msg=str(key),
        )
    return synchronous, overlapped
