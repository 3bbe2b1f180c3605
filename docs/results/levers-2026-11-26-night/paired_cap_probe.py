"""The probe behind "at most the match's length" (docs/performance.md, 2026-11-26 night): paired_speedup.py
with n-gram configs whose prompt_lookup_max is 7 proposing at most as many tokens as their match is long.

    python docs/results/levers-2026-11-26-night/paired_cap_probe.py --kernels fast --num-prompts 52 \
        --max-tokens 128 --repeats 2 --configs '[default, + "prompt_lookup_max": 7, + 6 tokens]'
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from specray.kernels.drafters import ngram  # noqa: E402
from specray.kernels.proposal import Proposal  # noqa: E402

uncapped = ngram.NgramDrafter.propose


def propose(self, requests):
    if self.max_n != 7:
        return uncapped(self, requests)
    out = []
    for r in requests:
        draft, n = ngram.lookup_match(np.asarray(r.token_ids, dtype=np.int64), r.num_draft_tokens, self.min_n,
                                      self.max_n) if r.num_draft_tokens else ([], 0)
        out.append(Proposal(draft[:n]))
    return out


ngram.NgramDrafter.propose = propose
import paired_speedup  # noqa: E402

paired_speedup.main(sys.argv[1:])
