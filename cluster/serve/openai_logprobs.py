"""Logprobs in the OpenAI response shapes, from a choice's tokens and the target worker's per-position
dicts (the top `n` tokens and the drawn one): chat's `content` list and the completions API's
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset`, whole or one stream chunk's part."""

from __future__ import annotations

from specray.cluster.outputs import most_likely, ranked
from specray.cluster.serve.deltas import ChoiceDeltas

CONTEXT_TOKENS = 4  # tokens decoded before a position's token, so its text keeps its leading space


def pieces(tokenizer, ids: list[int], i: int, toks: list[int], skip: bool = True) -> list[str]:
    """The text each of `toks` would add after ids[:i], decoded in context (`skip`: special tokens
    give none, as in the choice's text)."""
    window = ids[max(0, i - CONTEXT_TOKENS):i]
    before = tokenizer.decode(window, skip_special_tokens=skip)
    out = []
    for tok in toks:
        after = tokenizer.decode(window + [tok], skip_special_tokens=skip)
        out.append(after[len(before):] if after.startswith(before) else tokenizer.decode([tok]))
    return out


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[dict[int, float]] | None, n: int,
                  start: int = 0, skip: bool = True) -> dict | None:
    """{"content": [...]}: tokens [start:] with their logprobs and the `n` most likely tokens there
    (`logprobs` holds positions start onwards)."""
    if logprobs is None:
        return None
    content = []
    for i, lp in enumerate(logprobs, start):
        top = most_likely(lp, n)
        texts = pieces(tokenizer, token_ids, i, [token_ids[i]] + [t for t, _ in top], skip)
        content.append({"token": texts[0], "logprob": lp[token_ids[i]], "bytes": utf8(texts[0]),
                        "top_logprobs": [{"token": x, "logprob": v, "bytes": utf8(x)}
                                         for x, (_, v) in zip(texts[1:], top)]})
    return {"content": content}


def utf8(text: str) -> list[int]:
    """OpenAI's `bytes` of a token: its text's UTF-8 (a token that ends inside a character reads as
    U+FFFD in the text, so its bytes are those of the replacement, as vLLM gives them)."""
    return list(text.encode("utf-8", errors="replace"))


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[dict[int, float]] | None,
                        start: int = 0, offset: int = 0, skip: bool = True) -> tuple[dict | None, int]:
    """The legacy shape for tokens [start:]: each one's text, logprob, the most likely tokens with
    the drawn one (up to logprobs + 1, as OpenAI says; two that read alike keep the likelier) and
    its character offset, counted on from `offset`. -> (that, the offset after the last token)."""
    if logprobs is None:
        return None, offset
    tokens, offsets, tops = [], [], []
    for i, lp in enumerate(logprobs, start):
        ranked = most_likely(lp, len(lp))
        texts = pieces(tokenizer, token_ids, i, [token_ids[i]] + [t for t, _ in ranked], skip)
        tokens.append(texts[0])
        offsets.append(offset)
        offset += len(texts[0])
        top: dict[str, float] = {}
        for x, (_, v) in zip(texts[1:], ranked):
            top.setdefault(x, v)
        tops.append(top)
    token_logprobs = [lp[token_ids[i]] for i, lp in enumerate(logprobs, start)]
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}, offset


class CompletionDeltas(ChoiceDeltas):
    """ChoiceDeltas with the completions API's text_offset carried over a choice's chunks."""

    def __init__(self):
        super().__init__()
        self.offsets: dict[int, int] = {}  # the text_offset after the tokens sent

    def completion_logprobs(self, tokenizer, c, k0: int, skip: bool) -> dict | None:
        """The completions API's logprobs of choice c's tokens [k0:], offsets carried over chunks."""
        lps = None if c.logprobs is None else c.logprobs[k0:]
        out, self.offsets[c.index] = completion_logprobs(tokenizer, c.token_ids, lps, k0,
                                                         self.offsets.get(c.index, 0), skip)
        return out


def top_and(lp: dict[int, float], n: int, token: int) -> dict[int, float]:
    """A position's n most likely tokens and `token` (a prompt position may hold more: the request's
    prompt_logprobs and echo share the target's rows)."""
    return {**dict(most_likely(lp, n)), token: lp[token]}


def echo_logprobs(tokenizer, prompt_ids: list[int], prompt_logprobs: list, n: int,
                  skip: bool = True) -> dict:
    """The completions API's logprobs of an echoed prompt: null for its first token (nothing
    predicts it), then each prompt token's and the top n, offsets from 0."""
    first = pieces(tokenizer, prompt_ids, 0, [prompt_ids[0]], skip)[0]
    rows = [top_and(lp, n, t) for lp, t in zip(prompt_logprobs[1:], prompt_ids[1:])]
    rest, _ = completion_logprobs(tokenizer, prompt_ids, rows, 1, len(first), skip)
    return {"tokens": [first, *rest["tokens"]], "token_logprobs": [None, *rest["token_logprobs"]],
            "top_logprobs": [None, *rest["top_logprobs"]], "text_offset": [0, *rest["text_offset"]]}


def joined(echo: dict | None, completion: dict | None) -> dict | None:
    """An echoed prompt's logprobs followed by the completion's."""
    if echo is None or completion is None:
        return echo or completion
    return {k: echo[k] + completion[k] for k in echo}


def vllm_prompt_logprobs(tokenizer, prompt_ids: list[int], prompt_logprobs: list, n: int) -> list:
    """vLLM's `prompt_logprobs`: null for the first prompt token, then {token id: {logprob, rank,
    decoded_token}} of the prompt token and the top n (rank null for a prompt token outside them)."""
    decode = tokenizer.decode if tokenizer is not None else (lambda ids: None)
    out: list = [None]
    for lp, t in zip(prompt_logprobs[1:], prompt_ids[1:]):
        row = ranked(top_and(lp, n, t), n, lambda tok: decode([tok]))
        out.append({str(tok): {"logprob": v.logprob, "rank": v.rank, "decoded_token": v.decoded_token}
                    for tok, v in row.items()})
    return out
