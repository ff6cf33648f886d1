from mlxcel_core.stopping import StopStringMatcher


def _run(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    matcher = StopStringMatcher(stops)
    shown, stopped = [], False
    for piece in pieces:
        match = matcher.feed(piece)
        shown.append(match.text)
        if match.stopped:
            stopped = True
            break
    if not stopped:
        shown.append(matcher.flush())
    return shown, stopped


def test_stop_string_spanning_pieces_is_never_shown():
    shown, stopped = _run(["Hello", " wor", "ld", "!"], ["world"])
    assert stopped
    assert "".join(shown) == "Hello "
    assert all("wor" not in piece for piece in shown)


def test_text_that_only_looks_like_a_stop_prefix_is_released_later():
    shown, stopped = _run(["a <", "/b", "> c"], ["</s>"])
    assert not stopped
    assert shown == ["a ", "</b", "> c", ""]


def test_earliest_stop_string_wins_and_text_after_it_is_dropped():
    shown, stopped = _run(["x STOP y END z"], ["END", "STOP"])
    assert stopped
    assert shown == ["x "]


def test_text_held_back_at_the_end_is_flushed():
    shown, stopped = _run(["answer: 4", "<"], ["<|end|>"])
    assert not stopped
    assert "".join(shown) == "answer: 4<"
    assert shown[-1] == "<"


def test_no_stop_strings_passes_everything_through():
    assert _run(["a", "b"], []) == (["a", "b", ""], False)
