"""Timing a prompt's prefill through the engine, one engine per candidate chunk."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import TracebackType

from mlxcel_core.engine import (
    Engine,
    EngineConfig,
    EngineError,
    EngineRequest,
    OutputQueue,
    SchedulerConfig,
)
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams

# Chunk sizes (tokens) a search tries, besides the default, up to the prompt's length.
PREFILL_CHUNK_CANDIDATES = (128, 256, 512, 1024, 2048)
_GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)


def prefill_chunk_candidates(prompt_tokens: int, default: int) -> tuple[int, ...]:
    """`PREFILL_CHUNK_CANDIDATES` up to `prompt_tokens` (a longer chunk prefills such a
    prompt exactly as one of that length), and `default`, ascending."""
    kept = {chunk for chunk in PREFILL_CHUNK_CANDIDATES if chunk <= prompt_tokens}
    return tuple(sorted(kept | {default}))


class _NoText:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


class EnginePrefill:
    """Prefills one prompt on engines that differ only in their prefill chunk.

    Each engine runs one sequence at a time with prefix caching off, so every call
    computes the whole prompt anew, in chunks of its size, then samples one token: the
    path, and the time to first token, of a request the engine serves. Use it as a
    context manager; leaving it shuts the engines down.

    Args:
        model: the language model, its weights evaluated.
        prompt_ids: the prompt's token ids.
        chunks: the prefill chunk sizes (tokens), one engine each.
        block_size: tokens per KV block.

    Raises:
        InsufficientMemoryError, ValueError: as `Engine` does.
    """

    def __init__(
        self,
        model: LanguageModel,
        prompt_ids: Sequence[int],
        chunks: Sequence[int],
        *,
        block_size: int = 16,
    ) -> None:
        self._prompt_ids = tuple(prompt_ids)
        context_size = len(self._prompt_ids) + 1
        self._generation = GenerationConfig(context_size=context_size, max_tokens=1)
        self._engines: dict[int, Engine] = {}
        try:
            for chunk in chunks:
                config = EngineConfig(
                    scheduler=SchedulerConfig(
                        max_num_seqs=1,
                        max_num_batched_tokens=chunk,
                        max_prefill_chunk=chunk,
                    ),
                    context_size=context_size,
                    block_size=block_size,
                    num_kv_blocks=math.ceil(context_size / block_size) + 1,
                    enable_prefix_caching=False,
                    max_waiting=1,
                )
                self._engines[chunk] = Engine(model, config)
        except BaseException:
            self.close()
            raise

    def __call__(self, chunk: int) -> None:
        """Prefill the prompt with `chunk` and wait for its first token.

        Raises:
            EngineError: the request failed.
        """
        sink = OutputQueue()
        request = EngineRequest(self._prompt_ids, _GREEDY, self._generation, _NoText())
        self._engines[chunk].submit([request], sink)
        while not (output := sink.get()).finished:
            pass
        if output.error is not None:
            raise EngineError(f"the prefill with chunk {chunk} failed: {output.error}")

    def close(self) -> None:
        """Shut every engine down and wait for its thread, even through Ctrl-C, which is
        raised again once they have all ended: an engine thread still alive at exit
        aborts the process.

        Raises:
            KeyboardInterrupt: one arrived while waiting.
        """
        interrupted = False
        for engine in self._engines.values():
            interrupted |= engine.shutdown_through_interrupts()
        self._engines.clear()
        if interrupted:
            raise KeyboardInterrupt

    def __enter__(self) -> EnginePrefill:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
