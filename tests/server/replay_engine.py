"""An engine stand-in that replays a fixed reply, for routes whose model output must be exact
(tool markup, which a random model never writes)."""

from collections.abc import Sequence

from mlxcel_core.engine import EngineOutput, EngineRequest, OutputSink, RequestHandle
from mlxcel_core.request import FinishReason, GenerationStats

TWO_CALLS = (
    "I'll check both cities.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "°C"}}\n'
    "</tool_call>"
)


class ScriptedEngine:
    """Answers every request with `reply`, sent in pieces of `piece_size` characters, and
    ends it with `finish_reason`."""

    def __init__(self, reply: str, piece_size: int = 7) -> None:
        self.reply = reply
        self.piece_size = piece_size
        self.finish_reason = FinishReason.STOP
        self.prompts: list[tuple[int, ...]] = []
        self.requests: list[EngineRequest] = []

    def submit(self, requests: Sequence[EngineRequest], sink: OutputSink) -> RequestHandle:
        for request in requests:
            self.prompts.append(request.prompt_ids)
            self.requests.append(request)
            for start in range(0, len(self.reply), self.piece_size):
                piece = self.reply[start : start + self.piece_size]
                sink.put(EngineOutput(index=request.index, text=piece, token_id=0))
            stats = GenerationStats(len(request.prompt_ids), 0.01, 10, 0.01, 0)
            stop = EngineOutput(index=request.index, finish_reason=self.finish_reason, stats=stats)
            sink.put(stop)
        return RequestHandle(len(self.prompts))

    def shutdown(self, timeout: float | None = None) -> None:
        return None
