from word_errors import word_error_rate


def test_word_error_rate_counts_edits():
    assert word_error_rate("a b c d", "a b c d") == 0.0
    assert word_error_rate("a b c d", "a x c") == 0.5
    assert word_error_rate("Hello, world.", "hello world") == 0.0
    assert word_error_rate("the river bank", "the riverbank") == 2 / 3
