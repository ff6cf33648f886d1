"""A request's `thinking` field as the server's reasoning settings.

`{"type": "enabled", "budget_tokens": N}` is a reasoning budget of N tokens and
`{"type": "disabled"}` a budget of 0 (the template's `enable_thinking` switch off, where it
has one); either way the reasoning comes back as a thinking block. Without the field the
server's `--reasoning-budget` and `--reasoning-format` apply, `deepseek-legacy` acting as
`deepseek`: a thinking block has the reasoning, so no raw text is kept beside it.
"""

from __future__ import annotations

from mlxcel_server.anthropic_api.request import (
    DisabledThinking,
    EnabledThinking,
    MessagesRequest,
    ThinkingConfig,
)
from mlxcel_server.errors import invalid
from mlxcel_server.reasoning import ReasoningFormat
from mlxcel_server.settings import ServerSettings


def reasoning_budget(thinking: ThinkingConfig | None, settings: ServerSettings) -> int:
    """Most reasoning tokens per reply: -1 for no limit, 0 for no reasoning."""
    if isinstance(thinking, EnabledThinking):
        return thinking.budget_tokens
    if isinstance(thinking, DisabledThinking):
        return 0
    return settings.reasoning_budget


def reasoning_format(thinking: ThinkingConfig | None, settings: ServerSettings) -> ReasoningFormat:
    """Where the reasoning goes: a thinking block whenever the request sets `thinking`."""
    if thinking is not None:
        return ReasoningFormat.AUTO
    if settings.reasoning_format is ReasoningFormat.DEEPSEEK_LEGACY:
        return ReasoningFormat.DEEPSEEK
    return settings.reasoning_format


def check_thinking_budget(body: MessagesRequest) -> None:
    """Raises `ApiError` (400) when the thinking budget is not below `max_tokens`, as
    Anthropic refuses it: the reasoning would leave no room for the answer."""
    thinking = body.thinking
    if isinstance(thinking, EnabledThinking) and thinking.budget_tokens >= body.max_tokens:
        raise invalid(
            f"max_tokens must be greater than thinking.budget_tokens, got max_tokens "
            f"{body.max_tokens} and budget_tokens {thinking.budget_tokens}",
            "thinking.budget_tokens",
        )
