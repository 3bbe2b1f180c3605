"""What each choice of a streamed request has not sent yet, for every streaming API (HTTP, gRPC)."""

from __future__ import annotations


class ChoiceDeltas:
    """Each choice's text since its last chunk and the tokens committed since. A choice's text only
    grows: the router holds back a tail a stop string could begin with (`Sequence.streamable_text`)."""

    def __init__(self):
        self.text_sent: dict[int, int] = {}
        self.tokens_sent: dict[int, int] = {}
        self.done: set[int] = set()  # choices whose last chunk went out

    def take(self, c, tokens_alone: bool = False) -> tuple[str, int] | None:
        """-> (new text, the first token not sent yet), or None when the choice has nothing new or
        has had its last chunk. New tokens wait for a chunk with text or the end, unless
        `tokens_alone` (gRPC's deltas carry token ids whose text is not out yet)."""
        t0, k0 = self.text_sent.get(c.index, 0), self.tokens_sent.get(c.index, 0)
        text = c.text[t0:]
        fresh = text or c.finish_reason or (tokens_alone and len(c.token_ids) > k0)
        if c.index in self.done or not fresh:
            return None
        if c.finish_reason:
            self.done.add(c.index)
        self.text_sent[c.index], self.tokens_sent[c.index] = len(c.text), len(c.token_ids)
        return text, k0
