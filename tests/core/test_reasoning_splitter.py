"""The reasoning splitter: text pieces in, reasoning and answer out, markers removed."""

import itertools

import pytest

from mlxcel_core.reasoning import ReasoningMarkers, ReasoningPhase, ReasoningSplitter

THINK = ReasoningMarkers("<think>", "</think>")
CHANNELS = ReasoningMarkers(
    "<|channel|>analysis<|message|>", "<|end|>", "<|channel|>final<|message|>"
)
REPLY = "<think>\nFirst, 2 + 2.\nThat is 4.\n</think>\n\nThe answer is 4."


def split(text: str, markers=THINK, phase=ReasoningPhase.BEFORE, *, cuts=()) -> tuple[str, str]:
    """The reasoning and answer of `text` fed in pieces cut at `cuts`."""
    splitter = ReasoningSplitter(markers, phase)
    bounds = [0, *cuts, len(text)]
    deltas = [splitter.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    deltas.append(splitter.finish())
    return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


def test_reasoning_and_answer_are_separated_and_trimmed():
    assert split(REPLY) == ("First, 2 + 2.\nThat is 4.", "The answer is 4.")


@pytest.mark.parametrize("cut", range(1, len(REPLY)))
def test_a_marker_split_anywhere_never_leaks(cut):
    assert split(REPLY, cuts=(cut,)) == ("First, 2 + 2.\nThat is 4.", "The answer is 4.")


def test_one_character_pieces():
    assert split(REPLY, cuts=range(1, len(REPLY))) == split(REPLY)


def test_nothing_marker_like_is_released_before_it_is_decided():
    splitter = ReasoningSplitter(THINK, ReasoningPhase.REASONING)
    assert splitter.feed("Plan </th").reasoning == "Plan"
    delta = splitter.feed("ink>Go")
    assert (delta.reasoning, delta.content) == ("", "Go")
    assert splitter.phase is ReasoningPhase.ANSWER


def test_reasoning_opened_by_the_prompt():
    assert split("Hmm.\n</think>\n\nYes.", phase=ReasoningPhase.REASONING) == ("Hmm.", "Yes.")


def test_a_reply_without_reasoning_is_all_answer():
    assert split("Just the answer.") == ("", "Just the answer.")


def test_a_marker_after_answer_text_is_text():
    assert split("Use <think> tags </think> here.") == ("", "Use <think> tags </think> here.")


def test_a_closed_prompt_span_means_the_reply_is_answer():
    assert split("<think>x</think>y", phase=ReasoningPhase.ANSWER) == ("", "<think>x</think>y")


def test_an_unclosed_span_is_reasoning_to_the_end():
    assert split("<think>still thinking</th") == ("still thinking</th", "")


def test_whitespace_inside_reasoning_is_kept():
    assert split("<think>a\n\n  b \n</think>c") == ("a\n\n  b", "c")


def test_a_partial_start_marker_at_the_end_is_answer_text():
    assert split("<thi") == ("", "<thi")


CHANNEL_REPLY = (
    "<|channel|>analysis<|message|>User asks 2+2.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>4"
)


@pytest.mark.parametrize("cut", range(1, len(CHANNEL_REPLY), 3))
def test_channel_style_drops_the_framing_between_reasoning_and_answer(cut):
    assert split(CHANNEL_REPLY, CHANNELS, cuts=(cut,)) == ("User asks 2+2.", "4")


def test_channel_style_joins_two_analysis_messages():
    text = (
        "<|channel|>analysis<|message|>One.<|end|><|start|>assistant"
        "<|channel|>analysis<|message|>Two.<|end|><|start|>assistant"
        "<|channel|>final<|message|>Done."
    )
    assert split(text, CHANNELS) == ("One.\nTwo.", "Done.")


def test_channel_style_final_message_without_analysis():
    assert split("<|channel|>final<|message|>Hi", CHANNELS) == ("", "Hi")


def test_empty_markers_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        ReasoningMarkers("", "</think>")
