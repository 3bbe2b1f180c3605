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


def _committed(rounds: list[list[int]], **params) -> Sequence:
    seq = Sequence("s", "r", 0, [1], SamplingParams(max_tokens=8, **params), frozenset(), 64)
    words = _Words(["one ", "two ", "three ", "four ", "five "])
    for tokens in rounds:
        seq.commit(tokens, [{t: -0.5} for t in tokens], words)
        if seq.finished:
            break
    return seq


@pytest.mark.parametrize("stop, kept", [(["two"], 2), (["e t"], 2), (["hree fo"], 4), (["six"], 5)])
def test_a_round_stops_at_the_token_that_completes_a_stop_string(stop, kept):
    """A round of several tokens commits as plain decoding's one-token rounds do: ids, logprobs and
    text end where the stop string is complete, whatever the rounds' sizes."""
    plain = _committed([[0], [1], [2], [3], [4]], stop=stop)
    for rounds in ([[0, 1, 2, 3, 4]], [[0, 1], [2, 3, 4]], [[0], [1, 2, 3], [4]]):
        seq = _committed(rounds, stop=stop)
        assert seq.output_token_ids == plain.output_token_ids == [0, 1, 2, 3, 4][:kept]
        assert len(seq.logprobs) == kept and seq.text == plain.text
        assert (seq.finish_reason, seq.stop_reason) == (plain.finish_reason, plain.stop_reason)


class _Bytes:
    """A byte-level tokenizer: token i is pieces[i]; a cut multi-byte character decodes as U+FFFD."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("rounds", [[[0, 1, 0], [1, 0]], [[0, 1, 0, 1, 0]], [[0], [1, 0, 1], [0]]])
def test_a_round_ending_inside_a_character_keeps_the_characters_before_it(rounds):
    """Two tokens make one emoji; rounds that end inside one (the last, at max_tokens, too) give plain
    decoding's text: before, the whole round's text waited for a round that ended on a boundary."""
    words = _Bytes(["\U0001F600".encode()[:2], "\U0001F600".encode()[2:]])

    def run(rs):
        seq = Sequence("s", "r", 0, [1], SamplingParams(max_tokens=5), frozenset(), 64)
        for tokens in rs:
            seq.commit(tokens, None, words)
        return seq

    plain = run([[t] for r in rounds for t in r])
    assert plain.text == "\U0001F600\U0001F600" and plain.finish_reason == "length"
    assert run(rounds).text == plain.text and run(rounds).output_token_ids == plain.output_token_ids


@pytest.mark.parametrize("min_tokens, stop, text", [
    (0, ["e"], "on"), (1, ["e"], "one two thr"), (2, ["e"], "one two thr"), (3, ["e"], "one two three four fiv"),
    (1, ["e t"], "on"),  # vLLM's search reaches back into the held tokens' text by the stop's length
])
def test_stop_strings_count_from_the_token_after_min_tokens(min_tokens, stop, text):
    """vLLM's rule (its detokenizer's `len(output) > min_tokens`): the first min_tokens tokens never
    end the output, as stop tokens cannot (they are masked while fewer than min_tokens are out)."""
    for rounds in ([[0], [1], [2], [3], [4]], [[0, 1, 2, 3, 4]]):
        seq = _committed(rounds, stop=stop, min_tokens=min_tokens)
        assert seq.text == text and seq.stop_reason == stop[0]
