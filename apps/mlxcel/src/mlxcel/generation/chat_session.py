"""A conversation with a model on the engine: each turn re-renders the whole conversation
with the chat template, and the engine's prefix cache skips the part it has seen.

A reasoning model's reasoning is handed on apart from its answer, and only the answer
stays in the conversation, as the chat templates of reasoning models expect (Qwen3's
drops the reasoning of earlier turns itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlxcel.common.chat_prompt import encode_conversation
from mlxcel.generation.reply_reasoning import reply_reasoning, thinking_template_kwargs
from mlxcel.generation.reply_stream import make_reply_request, stream_reply
from mlxcel_core.engine import Engine
from mlxcel_core.errors import InputError
from mlxcel_core.reasoning import ReasoningDelta
from mlxcel_core.request import GenerationStats
from mlxcel_core.sampling import SamplingParams
from mlxcel_models.tokenizer import Tokenizer


class ConversationTooLongError(InputError):
    """The conversation with the new message does not fit the context; nothing was sent.

    Attributes:
        num_tokens: the rendered conversation's length in tokens.
        context_size: the context size in tokens.
    """

    def __init__(self, num_tokens: int, context_size: int) -> None:
        super().__init__(
            f"the conversation has {num_tokens} tokens but the context size is {context_size}"
        )
        self.num_tokens = num_tokens
        self.context_size = context_size


@dataclass(frozen=True)
class TurnResult:
    """How one reply ended.

    Attributes:
        text: the reply's answer (its reasoning left out), or the part of it streamed
            before an interrupt.
        stats: the engine's timings and token counts; None when interrupted.
        filled_context: the reply stopped because the context was full.
    """

    text: str
    stats: GenerationStats | None
    filled_context: bool

    @property
    def interrupted(self) -> bool:
        return self.stats is None


@dataclass(frozen=True)
class ChatSettings:
    """What every turn of a conversation shares.

    Attributes:
        params: the sampler settings.
        context_size: the context window in tokens (conversation plus reply).
        max_tokens: most tokens per reply; -1 = until the context is full.
        chat_template: Jinja text, or None for the model's own template.
        system_messages: the system message, if any, as a one-message list.
        reasoning_budget: most reasoning tokens per reply; -1 = no limit, 0 = no reasoning
            (the template's `enable_thinking` switch off, where it has one).
    """

    params: SamplingParams
    context_size: int
    max_tokens: int
    chat_template: str | None
    system_messages: tuple[dict[str, str], ...] = ()
    reasoning_budget: int = -1


class ChatSession:
    """The user and assistant turns of one conversation, answered on `engine`.

    A reply cut short by Ctrl-C stays in the conversation as far as its answer got, as
    llama-cli keeps it; a turn interrupted before any answer arrived is forgotten.
    """

    def __init__(self, engine: Engine, tokenizer: Tokenizer, settings: ChatSettings) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._settings = settings
        self._template_kwargs = thinking_template_kwargs(
            tokenizer, settings.chat_template, settings.reasoning_budget
        )
        self._turns: list[dict[str, str]] = []

    @property
    def turns(self) -> tuple[dict[str, str], ...]:
        """The user and assistant messages so far, oldest first (no system message)."""
        return tuple(self._turns)

    def clear(self) -> None:
        """Forget every turn; the system message stays."""
        self._turns.clear()

    def prompt_tokens(self, message: str) -> list[int]:
        """Token ids of the conversation with `message` as the next user turn.

        Raises:
            InputError: the chat template cannot render the conversation.
        """
        messages = [*self._settings.system_messages, *self._turns, _user(message)]
        return encode_conversation(
            self._tokenizer, messages, self._settings.chat_template, self._template_kwargs
        )

    def send(
        self,
        message: str,
        on_text: Callable[[str], None],
        on_reasoning: Callable[[str], None] = lambda _: None,
    ) -> TurnResult:
        """Answer `message`, passing each piece of the reply's answer to `on_text` and of
        its reasoning to `on_reasoning` as they arrive.

        A Ctrl-C (`KeyboardInterrupt`) while the reply streams stops it and returns.

        Raises:
            ConversationTooLongError: the conversation with `message` fills the context.
            InputError: the chat template cannot render the conversation.
            RunError: generation failed.
        """
        settings = self._settings
        tokens = self.prompt_tokens(message)
        context_size = settings.context_size
        if len(tokens) >= context_size:
            raise ConversationTooLongError(len(tokens), context_size)
        reasoning = reply_reasoning(
            self._tokenizer, settings.chat_template, tokens, settings.reasoning_budget
        )
        request = make_reply_request(
            self._tokenizer,
            tokens,
            settings.params,
            context_size=context_size,
            max_tokens=settings.max_tokens,
            reasoning=reasoning,
        )
        splitter = reasoning.make_splitter()
        pieces: list[str] = []

        def hand_on(delta: ReasoningDelta) -> None:
            if delta.reasoning:
                on_reasoning(delta.reasoning)
            if delta.content:
                pieces.append(delta.content)
                on_text(delta.content)

        def collect(text: str) -> None:
            hand_on(ReasoningDelta(content=text) if splitter is None else splitter.feed(text))

        try:
            final = stream_reply(self._engine, request, collect)
        except KeyboardInterrupt:
            reply = "".join(pieces)
            if reply:
                self._turns += [_user(message), _assistant(reply)]
            return TurnResult(reply, None, filled_context=False)
        if splitter is not None:
            hand_on(splitter.finish())
        reply = "".join(pieces)
        self._turns += [_user(message), _assistant(reply)]
        stats = final.stats
        filled = stats.prompt_tokens + stats.generated_tokens >= context_size
        return TurnResult(reply, stats, filled_context=filled)


def _user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def _assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}
