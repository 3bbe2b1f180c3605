"""Exact output distributions by enumerating every random choice a rule makes (tests only).

`enumerate_outcomes(fn)` runs `fn(draws)` once per distinct sequence of choices, replaying a script
of earlier choices and branching at the first new one, and sums the probability of each outcome.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from specray.kernels.proposal import VerifyResult
from specray.kernels.verify import tree as vt


class _Branch(Exception):
    def __init__(self, probs: list[float]):
        self.probs = probs


class ScriptedDraws:
    """Follows `script` (choice indices); raises _Branch at the first choice beyond it."""

    def __init__(self, script: list[int]):
        self.script, self.pos, self.weight = script, 0, 1.0

    def _choose(self, probs: list[float]) -> int:
        if self.pos == len(self.script):
            raise _Branch(probs)
        i = self.script[self.pos]
        self.pos += 1
        self.weight *= probs[i]
        return i

    def bernoulli(self, prob: float) -> bool:
        prob = min(1.0, max(0.0, float(prob)))
        return bool(self._choose([1.0 - prob, prob]))

    def categorical(self, weights: torch.Tensor) -> int:
        w = weights.double().flatten()
        return self._choose((w / w.sum()).tolist())


def enumerate_outcomes(fn) -> dict:
    out: dict = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        draws = ScriptedDraws(script)
        try:
            outcome = fn(draws)
        except _Branch as b:
            stack.extend(script + [i] for i, pr in enumerate(b.probs) if pr > 0)
            continue
        out[outcome] += draws.weight
    return dict(out)


def compose_rounds(round_dist, start: int, num_tokens: int) -> dict:
    """Distribution of the first `num_tokens` emitted tokens when rounds repeat from `start`;
    round_dist(ctx) -> {emitted tuple: probability} for one round after pending token ctx."""
    cache: dict = {}

    def dist(ctx: int, need: int) -> dict:
        if (ctx, need) in cache:
            return cache[(ctx, need)]
        out: dict = defaultdict(float)
        for emitted, pr in round_dist(ctx).items():
            if len(emitted) >= need:
                out[emitted[:need]] += pr
            else:
                for rest, pr2 in dist(emitted[-1], need - len(emitted)).items():
                    out[emitted + rest] += pr * pr2
        cache[(ctx, need)] = dict(out)
        return cache[(ctx, need)]

    return dist(start, num_tokens)


def longest_match_over_independent_samples(rows, proposal, draws):
    """The biased rule DESIGN §3 forbids: verify every root-to-leaf path as its own chain with its
    own samples y ~ q (shared prefixes sampled again per path), and keep the longest match."""
    kids = vt.children_lists(proposal.tree_parents())
    leaves = [i for i in range(proposal.num_draft_tokens) if not kids[i + 1]]
    best = None
    for leaf in leaves:
        path, node = [], leaf
        while node >= 0:
            path.insert(0, node)
            node = proposal.tree_parents()[node]
        accepted, end = [], -1
        for node in path:
            y = draws.categorical(rows[end + 1])
            if proposal.draft_token_ids[node] != y:
                break
            accepted.append(node)
            end = node
        else:
            y = draws.categorical(rows[end + 1])
        if best is None or len(accepted) > len(best[0]):
            best = (accepted, y)
    accepted, y = best
    return VerifyResult([proposal.draft_token_ids[i] for i in accepted], y, len(accepted) == len(path) and
                        not kids[accepted[-1] + 1] if accepted else False, proposal.num_draft_tokens,
                        accepted_nodes=accepted)
