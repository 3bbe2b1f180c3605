"""N-gram prompt lookup: propose the continuation of the earliest earlier occurrence of the
sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min). Deterministic, so
its proposals are point masses."""

from __future__ import annotations

import numpy as np

from specray.kernels.drafters.base import DraftRequest
from specray.kernels.proposal import Proposal


def lookup(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """tokens [seq_len] -> up to k tokens that followed an earlier match of the trailing n-gram."""
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
