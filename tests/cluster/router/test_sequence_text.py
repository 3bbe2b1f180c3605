"""The text a running sequence may stream: a tail a stop string could begin with is held back."""

import pytest

from specray.cluster.params import SamplingParams
from specray.cluster.router.sequence import Sequence, stop_prefix_len


@pytest.mark.parametrize("text, stops, held", [
    ("abc", [], 0), ("abc", ["x"], 0), ("abc", ["cd"], 1), ("abcd", ["cde", "bcdx"], 3),
    ("ab", ["abc"], 2), ("a", ["abc", "a"], 1), ("aa", ["aab"], 2), ("xab", ["ab"], 0),
])
def test_stop_prefix_len_by_hand(text, stops, held):
    """`ab` fully present would have finished the sequence; only proper beginnings are held."""
    assert stop_prefix_len(text, stops) == held


def _seq(**params) -> Sequence:
    seq = Sequence("s", "r", 0, [1], SamplingParams(max_tokens=8, **params), frozenset(), 64)
    seq.text = "one two th"
    return seq


def test_a_running_sequence_streams_up_to_a_possible_stop_and_all_once_finished():
    seq = _seq(stop=["three", "x"])
    assert seq.completion().text == "one two "
    seq.finish_reason = "length"
    assert seq.completion().text == "one two th"
    assert _seq(stop=["three"], include_stop_str_in_output=True).completion().text == "one two th"
    assert _seq().completion().text == "one two th"
