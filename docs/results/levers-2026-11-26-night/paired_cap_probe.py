"""Throwaway: paired_speedup with n-gram configs whose prompt_lookup_max is 7 proposing at most as
many tokens as their match is long (k <= n)."""
import sys
import numpy as np
sys.path.insert(0, "/work/main/benchmarks")
from specray.kernels.drafters import ngram
from specray.kernels.proposal import Proposal

def lookup_with_n(tokens, k, min_n, max_n):
    length = tokens.shape[0]
    n_top = min(max_n, length - 1)
    if n_top < min_n: return [], 0
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])
    if ends.size == 0: return [], 0
    matched = np.ones(ends.size, dtype=np.int64); alive = np.ones(ends.size, dtype=bool)
    for i in range(1, n_top):
        alive &= ends >= i
        alive[alive] = tokens[ends[alive] - i] == tokens[length - 1 - i]
        if not alive.any(): break
        matched += alive
    best = int(matched.max())
    if best < min_n: return [], 0
    start = int(ends[np.argmax(matched >= best)]) + 1
    return tokens[start:start + k].tolist(), best

orig = ngram.NgramDrafter.propose
def propose(self, requests):
    if self.max_n != 7: return orig(self, requests)
    out = []
    for r in requests:
        d, n = lookup_with_n(np.asarray(r.token_ids, dtype=np.int64), r.num_draft_tokens, self.min_n, self.max_n) if r.num_draft_tokens else ([], 0)
        out.append(Proposal(d[:n]))
    return out
ngram.NgramDrafter.propose = propose
import paired_speedup
paired_speedup.main(sys.argv[1:])
