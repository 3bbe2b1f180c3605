"""The text a running sequence may stream: a tail a stop string could begin with is held back."""

import pytest

from specray.cluster.params import SamplingParams
import random

from specray.cluster.router.sequence import Sequence
from specray.cluster.router.stops import StopTails, stop_prefix_len


@pytest.mark.parametrize("text, stops, held", [
    ("abc", [], 0), ("abc", ["x"], 0), ("abc", ["cd"], 1), ("abcd", ["cde", "bcdx"], 3),
    ("ab", ["abc"], 2), ("a", ["abc", "a"], 1), ("aa", ["aab"], 2), ("xab", ["ab"], 0),
])
def test_stop_prefix_len_by_hand(text, stops, held):
    """`ab` fully present would have finished the sequence; only proper beginnings are held."""
    assert stop_prefix_len(text, stops) == held


def test_stop_tails_follow_a_growing_text_as_the_specification_does():
    """Knuth-Morris-Pratt over the new characters gives `stop_prefix_len` of the whole text, on
    random texts over a small alphabet (many partial matches), as long as no stop is whole in it."""
    rng = random.Random(0)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab ") for _ in range(rng.randrange(1, 7))) for _ in range(rng.randrange(1, 4))]
        tails, text = StopTails(stops), ""
        for _ in range(rng.randrange(1, 6)):
            new = "".join(rng.choice("ab ") for _ in range(rng.randrange(0, 5)))
            text += new
            tails.feed(new)
            if not any(s in text for s in stops):
                assert tails.held() == stop_prefix_len(text, stops), (text, stops)


class _Words:
    """A tokenizer whose token i reads as words[i]."""

    def __init__(self, words):
        self.words = words

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.words[i] for i in ids)


def _seq(**params) -> Sequence:
    seq = Sequence("s", "r", 0, [1], SamplingParams(max_tokens=8, **params), frozenset(), 64)
    seq.append([0, 1, 2], None)
    seq.detokenize(_Words(["one ", "two ", "th"]))
    return seq


def test_a_running_sequence_streams_up_to_a_possible_stop_and_all_once_finished():
    seq = _seq(stop=["three", "x"])
    assert seq.text == "one two th" and seq.completion().text == "one two "
    seq.finish_reason = "length"
    assert seq.completion().text == "one two th"
    assert _seq(stop=["three"], include_stop_str_in_output=True).completion().text == "one two th"
    assert _seq().completion().text == "one two th"
