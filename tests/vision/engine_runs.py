"""Running a vision-language model through the engine and through a plain greedy loop, for
the families' engine tests."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.engine import Engine, EngineConfig, EngineOutput, EngineRequest, OutputQueue
from mlxcel_core.images import RowImages
from mlxcel_core.request import GenerationConfig
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.image_prompt import ImagePrompt
from mlxcel_vision.model import VisionLanguageModel

TIMEOUT = 120.0


class NullDetokenizer:
    def add_token(self, token_id: int) -> str:
        return ""

    def finalize(self) -> str:
        return ""


def greedy_request(prompt: ImagePrompt, index: int, generation: GenerationConfig) -> EngineRequest:
    """A greedy engine request for `prompt`, its images included."""
    return EngineRequest(
        prompt_ids=prompt.prompt_ids,
        sampling=SamplingParams(temperature=0.0),
        generation=generation,
        detokenizer=NullDetokenizer(),
        index=index,
        images=prompt.images,
    )


def greedy_alone(model: VisionLanguageModel, prompt: ImagePrompt, max_tokens: int) -> list[int]:
    """Greedy tokens from one whole-prompt pass, then one token per pass over dense caches,
    the images given to every pass."""
    ids, tokens = list(prompt.prompt_ids), []
    cache = model.make_cache()
    logits = model(mx.array([ids]), cache, images=[RowImages(0, prompt.images)], last_only=True)
    for step in range(max_tokens):
        tokens.append(int(mx.argmax(logits[0, -1]).item()))
        offset = len(ids) + step
        logits = model(mx.array([tokens[-1:]]), cache, images=[RowImages(offset, prompt.images)])
    return tokens


def run_engine(
    model: VisionLanguageModel,
    config: EngineConfig,
    groups: Sequence[Sequence[EngineRequest]],
) -> list[list[EngineOutput]]:
    """Submit each group after the one before it finished, on one engine; each request's
    outputs, in submission order."""
    engine = Engine(model, config)
    results = []
    try:
        for requests in groups:
            sink = OutputQueue()
            engine.submit(requests, sink)
            outputs, finished = [], 0
            while finished < len(requests):
                outputs.append(sink.get(timeout=TIMEOUT))
                finished += outputs[-1].finished
            results += [[o for o in outputs if o.index == r.index] for r in requests]
    finally:
        engine.shutdown(timeout=TIMEOUT)
    return results


def tokens_of(outputs: Sequence[EngineOutput]) -> list[int]:
    """The sampled tokens of a request that finished without an error."""
    assert not [o.error for o in outputs if o.error is not None]
    return [o.token_id for o in outputs if o.token_id is not None]
