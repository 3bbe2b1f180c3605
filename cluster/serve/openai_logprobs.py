"""Logprobs in the OpenAI response shapes, from a choice's tokens and the target worker's per-position
dicts (the top `n` tokens and the drawn one): chat's `content` list and the completions API's
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset`, whole or one stream chunk's part."""

from __future__ import annotations

from specray.cluster.outputs import most_likely, ranked
from specray.cluster.serve.deltas import ChoiceDeltas
from specray.kernels.proposal import PositionLogprobs

CONTEXT_TOKENS = 4  # tokens decoded before a position's token, so its text keeps its leading space


def context(tokenizer, ids: list[int], i: int, skip: bool = True, prompt_ids=None) -> list[int]:
    """The tokens before ids[i] that its text is decoded after: CONTEXT_TOKENS of them, or a few
    more where those begin inside a character (which would decode as U+FFFD). `prompt_ids`: a
    choice's prompt, whose last tokens come before its first (whose text is read after the prompt,
    as the choice's text is)."""
    most = 2 * CONTEXT_TOKENS
    before = list(prompt_ids[-most:]) if prompt_ids is not None else []
    total = len(before) + i  # tokens there are before ids[i]
    head = (before + list(ids[max(0, i - most):i]))[-most:]  # [min(total, most)]
    for back in range(CONTEXT_TOKENS, most + 1):
        window = head[max(0, len(head) - back):]
        if back >= total or not tokenizer.decode(window, skip_special_tokens=skip).startswith("\ufffd"):
            return window
    return head[max(0, len(head) - CONTEXT_TOKENS):]


def pieces(tokenizer, ids: list[int], i: int, toks: list[int], skip: bool = True, prompt_ids=None) -> list[str]:
    """The text each of `toks` would add after ids[:i], decoded in context (`skip`: special tokens
    give none, as in the choice's text; `prompt_ids`: context's)."""
    window = context(tokenizer, ids, i, skip, prompt_ids)
    before = tokenizer.decode(window, skip_special_tokens=skip)
    out = []
    for tok in toks:
        after = tokenizer.decode(window + [tok], skip_special_tokens=skip)
        out.append(after[len(before):] if after.startswith(before) else tokenizer.decode([tok]))
    return out


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[dict[int, float]] | None, n: int,
                  start: int = 0, skip: bool = True, prompt_ids=None) -> dict | None:
    """{"content": [...]}: tokens [start:] with their logprobs and the `n` most likely tokens there
    (`logprobs` holds positions start onwards; `prompt_ids`: the texts read after the prompt)."""
    if logprobs is None:
        return None
    content = []
    for i, lp in enumerate(logprobs, start):
        top = most_likely(lp, n)
        texts = pieces(tokenizer, token_ids, i, [token_ids[i]] + [t for t, _ in top], skip, prompt_ids)
        content.append({"token": texts[0], "logprob": lp[token_ids[i]],
                        "bytes": token_bytes(tokenizer, token_ids[i], texts[0]),
                        "top_logprobs": [{"token": x, "logprob": v, "bytes": token_bytes(tokenizer, t, x)}
                                         for x, (t, v) in zip(texts[1:], top)]})
    return {"content": content}


def utf8(text: str) -> list[int]:
    """A token text's UTF-8."""
    return list(text.encode("utf-8", errors="replace"))


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's characters -> the bytes they stand for: printable bytes stand for
    themselves, the others for the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(moved)}}


BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(tokenizer, token_id: int, text: str) -> list[int]:
    """OpenAI's `bytes` of a token, which clients join to rebuild characters split over tokens: a
    token that holds part of a character reads as U+FFFD (or as nothing, in context), so its own
    bytes come from its vocabulary entry (byte-level BPE, or a `<0xNN>` byte token); else its text's UTF-8."""
    if text and "\ufffd" not in text or token_id in tokenizer.all_special_ids:
        return utf8(text)
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return [int(piece[3:5], 16)]
    if isinstance(piece, str) and piece and all(c in BYTE_LEVEL for c in piece):
        return [BYTE_LEVEL[c] for c in piece]
    return utf8(text)


def advance(tokenizer, ids: list[int], i: int, skip: bool = True, prompt_ids=None) -> int:
    """Characters token ids[i] adds to the text: a token that ends inside a character adds none,
    the one that completes it adds the character (so offsets never pass the text)."""
    window = context(tokenizer, ids, i, skip, prompt_ids)
    before = tokenizer.decode(window, skip_special_tokens=skip).rstrip("\ufffd")
    after = tokenizer.decode(window + [ids[i]], skip_special_tokens=skip).rstrip("\ufffd")
    return max(0, len(after) - len(before))


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[dict[int, float]] | None,
                        start: int = 0, offset: int = 0, skip: bool = True,
                        prompt_ids=None) -> tuple[dict | None, int]:
    """The legacy shape for tokens [start:]: each one's text, logprob, the most likely tokens with
    the drawn one (up to logprobs + 1, as OpenAI says; two that read alike keep the likelier) and
    its character offset, counted on from `offset`. -> (that, the offset after the last token)."""
    if logprobs is None:
        return None, offset
    tokens, offsets, tops = [], [], []
    for i, lp in enumerate(logprobs, start):
        ranked = most_likely(lp, len(lp))
        texts = pieces(tokenizer, token_ids, i, [token_ids[i]] + [t for t, _ in ranked], skip, prompt_ids)
        tokens.append(texts[0])
        offsets.append(offset)
        offset += advance(tokenizer, token_ids, i, skip, prompt_ids)
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

    def completion_logprobs(self, tokenizer, c, k0: int, skip: bool, prompt_ids=None) -> dict | None:
        """The completions API's logprobs of choice c's tokens [k0:], offsets carried over chunks."""
        lps = None if c.logprobs is None else c.logprobs[k0:]
        out, self.offsets[c.index] = completion_logprobs(tokenizer, c.token_ids, lps, k0,
                                                         self.offsets.get(c.index, 0), skip, prompt_ids)
        return out


def top_and(lp: dict[int, float], n: int, token: int) -> dict[int, float]:
    """A position's n most likely tokens and `token` (a prompt position may hold more: the request's
    prompt_logprobs and echo share the target's rows); a PositionLogprobs keeps its rank."""
    if isinstance(lp, PositionLogprobs) and lp.token == token:
        return lp.top(n)
    return {**dict(most_likely(lp, n)), token: lp[token]}


def echo_logprobs(tokenizer, prompt_ids: list[int], prompt_logprobs: list, n: int,
                  skip: bool = True) -> dict:
    """The completions API's logprobs of an echoed prompt: null for its first token (nothing
    predicts it), then each prompt token's and the top n, offsets from 0."""
    first = pieces(tokenizer, prompt_ids, 0, [prompt_ids[0]], skip)[0]
    rows = [top_and(lp, n, t) for lp, t in zip(prompt_logprobs[1:], prompt_ids[1:])]
    rest, _ = completion_logprobs(tokenizer, prompt_ids, rows, 1, advance(tokenizer, prompt_ids, 0, skip), skip)
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
