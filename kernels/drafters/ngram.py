"""N-gram prompt lookup: propose the continuation of the earliest earlier occurrence of the
sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min). Deterministic, so
its proposals are point masses."""

from __future__ import annotations

import numpy as np

from specray.kernels.drafters.base import DraftRequest
from specray.kernels.proposal import Proposal


def lookup(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """tokens [seq_len] -> up to k tokens that followed an earlier match of the trailing n-gram:
    `lookup_reference`'s answer, from the earlier positions of the last token only (each extended
    backwards while it matches) instead of a window scan per n (slow on long sequences: docs/performance.md)."""
    return lookup_match(tokens, k, min_n, max_n)[0]


def lookup_match(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    """`lookup`, and the length of the match its proposal follows (0 where there is none)."""
    length = tokens.shape[0]
    n_top = min(max_n, length - 1)
    if n_top < min_n:
        return [], 0
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])  # [num_candidates] match ends
    if ends.size == 0:
        return [], 0
    matched = np.ones(ends.size, dtype=np.int64)  # [num_candidates] trailing tokens matched so far
    alive = np.ones(ends.size, dtype=bool)
    for i in range(1, n_top):
        alive &= ends >= i
        alive[alive] = tokens[ends[alive] - i] == tokens[length - 1 - i]
        if not alive.any():
            break
        matched += alive
    best = int(matched.max())
    if best < min_n:
        return [], 0
    start = int(ends[np.argmax(matched >= best)]) + 1  # the earliest of the longest matches
    return tokens[start:start + k].tolist(), best


def lookup_reference(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """The specification: for n from max_n down to min_n, the earliest earlier window equal to the
    trailing n tokens; its continuation."""
    length = tokens.shape[0]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # [L - n, n]
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramDrafter:
    name = "ngram"

    def __init__(self, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4):
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{prompt_lookup_min} and {prompt_lookup_max}")
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        out = []
        for r in requests:
            draft = (lookup(np.asarray(r.token_ids, dtype=np.int64), r.num_draft_tokens, self.min_n, self.max_n)
                     if r.num_draft_tokens else [])
            out.append(Proposal(draft))
        return out

    def release(self, seq_id: object) -> None:
        pass


def build(options) -> NgramDrafter:
    """The registry's builder (`options`: a DraftOptions)."""
    return NgramDrafter(options.prompt_lookup_min, options.prompt_lookup_max)
