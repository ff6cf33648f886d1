"""Quantized KV caches on the real SmolLM2 (CPU): long-context recall and greedy agreement.

A ~3,000-token chat prompt hides a five-digit code in filler text, stated twice ("The secret
code is 48213. Remember it. 48213 is the secret code.", as in passkey retrieval), and asks for
it at temperature 0; the reply must contain the code with f16, q8_0 and turbo4 caches, also
as the second long turn of a conversation (which names its number differently, so the first
turn's code never competes for the answer) and with four such prompts (different codes)
running at once on one server. q4_0 runs only the second long turn: that case fails without
q4_0's default residual window (another code is answered), and each q4_0 case costs minutes
of CPU prefill. On short prompts, q8_0's first 16 greedy tokens must equal
f16's for most of them.

The 135M model recalls a code stated once by a narrow margin: the first digits' log-probability
led the runner-up by 0.3 to 1.2 nats, so a machine whose float rounding differs could answer
another code. Stated twice, and with the second turn's number named apart, the smallest lead
measured was 0.9 to 1.5 nats in every case (docs/kv-cache.md).

Each cache type gets one `mlxcel serve -ctk TYPE -ctv TYPE` process for the module (which
preloads OpenBLAS where it is installed, as in the other serving tests), with prefix
caching on as in serving: the prompts share their filler up to the code, so later cases
reuse those blocks (stored in the type under test) and compute mostly what differs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from filler_text import filler
from live_server import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.long]

MODEL = "smollm2"
SERVER_FLAGS = ("-a", MODEL, "-np", "4", "-c", "8192", "-ub", "512", "--block-size", "16",
                "--kv-cache-blocks", "2100")  # fmt: skip
TIMEOUT_SECONDS = 900.0
# Every case runs these; q4_0 only the second long turn.
CACHE_TYPES = ("f16", "q8_0", "turbo4")
CODES = (48213, 10957, 73640, 29381, 86124)
# Sentences of filler before and after the code: about 2,900 tokens with the template.
SENTENCES_BEFORE = 200
SENTENCES_AFTER = 230
SHORT_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Name three primary colours.",
    "How many legs does a spider have?",
    "Give me a synonym for happy.",
    "What is 12 times 12?",
    "Describe a cat in one sentence.",
    "What language is spoken in Brazil?",
)


@dataclass(frozen=True)
class Reply:
    text: str
    completion_tokens: int


def needle_turn(code: int, *, name: str = "secret code", start: int = 0) -> dict:
    """A user turn: filler, the code (called `name`) stated twice, more filler, then the
    question."""
    before = filler(SENTENCES_BEFORE, start)
    after = filler(SENTENCES_AFTER, start + 5)
    return {
        "role": "user",
        "content": (
            f"{before} The {name} is {code}. Remember it. {code} is the {name}. {after}\n\n"
            f"What is the {name} mentioned in the text above? Answer with the five-digit "
            "number only."
        ),
    }


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, LiveServer]]:
    """One server per cache type, started on first use."""
    started: dict[str, LiveServer] = {}

    class Servers(dict):
        def __missing__(self, cache_type: str) -> LiveServer:
            types = ("-ctk", cache_type, "-ctv", cache_type)
            started[cache_type] = self[cache_type] = LiveServer(*SERVER_FLAGS, *types)
            return started[cache_type]

    yield Servers()
    for server in started.values():
        assert server.stop() == 0, server.stderr()


def chat(server: LiveServer, messages: Sequence[dict], max_tokens: int) -> Reply:
    client = server.client(timeout=TIMEOUT_SECONDS)
    completion = client.chat.completions.create(
        model=MODEL, messages=list(messages), temperature=0, max_tokens=max_tokens
    )
    return Reply(completion.choices[0].message.content, completion.usage.completion_tokens)


def replies(
    server: LiveServer, conversations: Sequence[Sequence[dict]], *, max_tokens: int = 20
) -> list[Reply]:
    """Greedy replies, all conversations sent at once."""
    with server.stderr_on_failure(), ThreadPoolExecutor(len(conversations)) as pool:
        return list(pool.map(lambda c: chat(server, c, max_tokens), conversations))


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_a_long_prompt_recalls_its_hidden_code(servers, cache_type):
    (reply,) = replies(servers[cache_type], [[needle_turn(CODES[0])]])
    assert str(CODES[0]) in reply.text, reply


@pytest.mark.parametrize("cache_type", (*CACHE_TYPES, "q4_0"))
def test_a_second_long_turn_recalls_its_own_code(servers, cache_type):
    server = servers[cache_type]
    first = [needle_turn(CODES[0])]
    replies(server, [first])  # the first turn's blocks, cached for the second to reuse
    second = [
        *first,
        {"role": "assistant", "content": f"The secret code is {CODES[0]}."},
        needle_turn(CODES[1], name="pass key", start=3),
    ]
    (reply,) = replies(server, [second])
    assert str(CODES[1]) in reply.text, reply


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_four_long_prompts_at_once_each_recall_their_code(servers, cache_type):
    codes = (CODES[0], *CODES[2:])
    got = replies(servers[cache_type], [[needle_turn(code)] for code in codes])
    for code, reply in zip(codes, got, strict=True):
        assert str(code) in reply.text, (code, got)


def test_q8_0_greedy_replies_equal_f16_on_most_short_prompts(servers):
    conversations = [[{"role": "user", "content": prompt}] for prompt in SHORT_PROMPTS]
    f16 = replies(servers["f16"], conversations, max_tokens=16)
    q8_0 = replies(servers["q8_0"], conversations, max_tokens=16)
    assert sum(reply.completion_tokens for reply in f16) > 8 * 8
    same = [a == b for a, b in zip(f16, q8_0, strict=True)]
    assert sum(same) >= 6, list(zip(f16, q8_0, strict=True))
