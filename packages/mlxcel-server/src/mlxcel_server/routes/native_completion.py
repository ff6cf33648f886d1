"""llama-server's `POST /completion`: a raw prompt, no chat template, on the same engine path
as `/v1/completions`, with llama-server's own request and reply fields."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from quart import Blueprint, Response, jsonify

from mlxcel_core.engine import EngineOutput
from mlxcel_core.logprobs import TokenLogprobs
from mlxcel_models.tokenizer import Tokenizer
from mlxcel_server import generation
from mlxcel_server.errors import ApiError
from mlxcel_server.native_completion import (
    NativeCompletion,
    NativeCompletionRequest,
    check_native_fields,
    final_fields,
    make_probs,
    num_probs,
    prompt_ids,
)
from mlxcel_server.settings import ServerSettings
from mlxcel_server.sse import encode_event, sse_response
from mlxcel_server.state import ServerState
from mlxcel_server.stop_strings import StopStringTracker
from mlxcel_server.structured import request_grammar
from mlxcel_server.validation import parse_body


async def _events(
    outputs: AsyncIterator[EngineOutput],
    tracker: StopStringTracker,
    tokenizer: Tokenizer,
    prompt_tokens: int,
    base: dict,
) -> AsyncIterator[bytes]:
    """One event per generated token (its text may be empty while a character or a stop
    string is pending), the last with the totals; llama-server ends the stream there,
    without OpenAI's `[DONE]`."""
    text: list[str] = []
    try:
        async for output in outputs:
            tracker.add(output)
            text.append(output.text)
            piece: dict = {
                "content": output.text,
                "tokens": [] if output.token_id is None else [output.token_id],
                "stop": False,
                "tokens_predicted": len(tracker.token_ids),
                "tokens_evaluated": prompt_tokens,
            }
            if output.logprobs is not None:
                piece["completion_probabilities"] = make_probs([output.logprobs], tokenizer)
            if output.finish_reason is not None and output.stats is not None:
                piece.update(base, **final_fields(output.stats, output.finish_reason, tracker))
                piece["has_new_line"] = "\n" in "".join(text)
            elif output.token_id is None:
                continue
            yield encode_event(NativeCompletion(**piece).model_dump(mode="json", exclude_none=True))
    except ApiError as error:
        yield encode_event(error.body())


def make_blueprint(state: ServerState, settings: ServerSettings) -> Blueprint:
    blueprint = Blueprint("native_completion", __name__)

    @blueprint.post("/completion")
    async def completion() -> Response:
        body = await parse_body(NativeCompletionRequest)
        model = state.require_model()
        check_native_fields(body)
        tokenizer = model.loaded.tokenizer
        ids = await asyncio.to_thread(prompt_ids, body.prompt, tokenizer)
        generation.check_prompt(ids, model.context_size, "prompt")
        prepared = generation.prepare(
            [ids],
            body,
            model,
            settings,
            id_prefix="cmpl",
            num_top_logprobs=num_probs(body),
            grammar=request_grammar(body),
        )
        prompt_text = await asyncio.to_thread(tokenizer.decode, ids, skip_special_tokens=False)
        base = {"model": model.model_id, "prompt": prompt_text}
        tracker = StopStringTracker(tokenizer, prepared.requests[0].generation.stop_strings)
        outputs = await generation.stream(model, prepared)
        if body.stream:
            return sse_response(_events(outputs, tracker, tokenizer, len(ids), base))
        texts: list[str] = []
        probs: list[TokenLogprobs] = []
        reply: dict = {}
        async for output in outputs:
            tracker.add(output)
            texts.append(output.text)
            if output.logprobs is not None:
                probs.append(output.logprobs)
            if output.finish_reason is not None and output.stats is not None:
                reply = final_fields(output.stats, output.finish_reason, tracker)
        content = "".join(texts)
        completion = NativeCompletion(
            **base,
            **reply,
            content=content,
            tokens=list(tracker.token_ids) if body.return_tokens else [],
            tokens_evaluated=len(ids),
            has_new_line="\n" in content,
            completion_probabilities=None if not probs else make_probs(probs, tokenizer),
        )
        return jsonify(completion.model_dump(mode="json", exclude_none=True))

    return blueprint
