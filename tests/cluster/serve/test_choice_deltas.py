"""ChoiceDeltas: each choice's new text and tokens once, tokens waiting for text, one finish a choice."""

from specray.cluster.outputs import CompletionOutput
from specray.cluster.serve.deltas import ChoiceDeltas


def test_tokens_wait_for_their_text_and_each_choice_finishes_once():
    d = ChoiceDeltas()
    assert d.take(CompletionOutput(0, "", [5])) is None  # a token whose text is held back
    assert d.take(CompletionOutput(0, "ab", [5, 6])) == ("ab", 0)
    assert d.take(CompletionOutput(1, "x", [9])) == ("x", 0)  # choices apart
    assert d.take(CompletionOutput(0, "ab", [5, 6])) is None
    assert d.take(CompletionOutput(0, "abc", [5, 6, 7], "stop")) == ("c", 2)
    assert d.take(CompletionOutput(0, "abc", [5, 6, 7], "stop")) is None  # finished: never again
    assert d.take(CompletionOutput(1, "x", [9, 3], "length")) == ("", 1)  # a finish with no new text
