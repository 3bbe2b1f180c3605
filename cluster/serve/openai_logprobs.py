"""Logprobs in the OpenAI response shapes, from a choice's tokens and the target worker's per-position
dicts (the top `n` tokens and the drawn one): chat's `content` list and the completions API's
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset`, whole or one stream chunk's part."""

from __future__ import annotations

from specray.cluster.outputs import most_likely

CONTEXT_TOKENS = 4  # tokens decoded before a position's token, so its text keeps its leading space


def piece(tokenizer, ids: list[int], i: int, tok: int | None = None) -> str:
    """The text token `tok` (default ids[i]) adds after ids[:i], as decoded in context."""
    window = ids[max(0, i - CONTEXT_TOKENS):i]
    tok = ids[i] if tok is None else tok
    before, after = tokenizer.decode(window), tokenizer.decode(window + [tok])
    return after[len(before):] if after.startswith(before) else tokenizer.decode([tok])


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[dict[int, float]] | None, n: int,
                  start: int = 0) -> dict | None:
    """{"content": [...]}: tokens [start:] with their logprobs and the `n` most likely tokens there
    (`logprobs` holds positions start onwards)."""
    if logprobs is None:
        return None
    content = []
    for i, lp in enumerate(logprobs, start):
        top = [{"token": piece(tokenizer, token_ids, i, t), "logprob": v} for t, v in most_likely(lp, n)]
        content.append({"token": piece(tokenizer, token_ids, i), "logprob": lp[token_ids[i]], "top_logprobs": top})
    return {"content": content}


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[dict[int, float]] | None,
                        start: int = 0, offset: int = 0) -> tuple[dict | None, int]:
    """The legacy shape for tokens [start:]: each one's text, logprob, the most likely tokens with
    the drawn one (up to logprobs + 1, as OpenAI says) and its character offset, counted on from
    `offset`. -> (that, the offset after the last token)."""
    if logprobs is None:
        return None, offset
    tokens, offsets, tops = [], [], []
    for i, lp in enumerate(logprobs, start):
        tokens.append(piece(tokenizer, token_ids, i))
        offsets.append(offset)
        offset += len(tokens[-1])
        tops.append({piece(tokenizer, token_ids, i, t): v for t, v in most_likely(lp, len(lp))})
    token_logprobs = [lp[token_ids[i]] for i, lp in enumerate(logprobs, start)]
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}, offset


class ChoiceDeltas:
    """What each choice of a streamed request has not sent yet: its text since the last chunk and
    the tokens (with their logprobs) committed since. A choice's text only grows: the router holds
    back a tail a stop string could begin with (`Sequence.streamable_text`)."""

    def __init__(self):
        self.text_sent: dict[int, int] = {}
        self.tokens_sent: dict[int, int] = {}
        self.offsets: dict[int, int] = {}  # the completions API's text_offset after the tokens sent
        self.done: set[int] = set()  # choices whose last chunk went out

    def take(self, c) -> tuple[str, int] | None:
        """-> (new text, the first token not sent yet), or None when the choice has nothing new or
        has had its last chunk. Tokens wait for a chunk with text or the end."""
        t0, k0 = self.text_sent.get(c.index, 0), self.tokens_sent.get(c.index, 0)
        text = c.text[t0:]
        if c.index in self.done or not (text or c.finish_reason):
            return None
        if c.finish_reason:
            self.done.add(c.index)
        self.text_sent[c.index], self.tokens_sent[c.index] = len(c.text), len(c.token_ids)
        return text, k0

    def completion_logprobs(self, tokenizer, c, k0: int) -> dict | None:
        """The completions API's logprobs of choice c's tokens [k0:], offsets carried over chunks."""
        lps = None if c.logprobs is None else c.logprobs[k0:]
        out, self.offsets[c.index] = completion_logprobs(tokenizer, c.token_ids, lps, k0, self.offsets.get(c.index, 0))
        return out
