"""What a running sequence's stream must hold back: the end of its text that a stop string could still
begin with (a stop string found later cuts the text there, and a stream must never have sent it)."""

from __future__ import annotations


def stop_prefix_len(text: str, stops: list[str]) -> int:
    """The specification: the length of the longest end of `text` that is a proper beginning of
    one of `stops`."""
    return max((k for stop in stops for k in range(1, min(len(stop) - 1, len(text)) + 1)
                if text.endswith(stop[:k])), default=0)


def _failure(stop: str) -> list[int]:
    """Knuth-Morris-Pratt: fail[i] = the longest proper beginning of stop[:i + 1] that also ends it."""
    fail, k = [0] * len(stop), 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = fail[k - 1]
        k += stop[i] == stop[k]
        fail[i] = k
    return fail


class StopTails:
    """`stop_prefix_len` of a growing text, kept up to date character by character: a round costs
    its new characters (times the stops), however long the text or the stop strings are."""

    def __init__(self, stops: list[str]):
        assert all(stops), "stop strings are non-empty"
        self.stops, self.fails = stops, [_failure(s) for s in stops]
        self.matched = [0] * len(stops)  # per stop: the longest end of the text that begins it

    def feed(self, new_text: str) -> None:
        for j, (stop, fail) in enumerate(zip(self.stops, self.fails)):
            k = self.matched[j]
            for ch in new_text:
                if k == len(stop):  # a whole match (the sequence stops there): go on from its border
                    k = fail[k - 1]
                while k and ch != stop[k]:
                    k = fail[k - 1]
                k += ch == stop[k]
            self.matched[j] = fail[k - 1] if k == len(stop) else k

    def held(self) -> int:
        """How many characters at the end of the text to hold back."""
        return max(self.matched, default=0)
