"""Adaptive speculation length (speculative_config `adaptive: true`): each round, each sequence
proposes the number of draft tokens that maximises the tokens the round emits per unit of its cost.

A round of draft length k emits 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens on average, where a_i is
the chance that draft position i is accepted once the ones before it were (measured per sequence,
recent rounds weighing most). It costs the target's forward step of 1 + k rows (measured by the
target worker on this machine, kernels/row_costs.py), the draft's steps, and what a round costs
besides whatever its length (verification, sampling, hops, the router's bookkeeping): the last two
timed by the router, round by round. Where no length beats k = 0 the sequence decodes without
a draft and drafts one token after `PROBE_EVERY` such rounds to measure its acceptance again, the
wait doubling (up to `PROBE_MAX`) while probes keep showing that drafting does not pay: a probe
costs the draft its catch-up on every token committed meanwhile.

Lossless: a round's length is chosen before the draft or the target sees the round, from earlier
rounds only, and verification is unchanged. Seeded sampled requests keep the configured length,
so their outputs repeat run to run (timings never steer which tokens they draw).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from specray.kernels.row_costs import RowCosts

DECAY = 0.9  # a sequence's acceptance counts fade by this each round it drafts
POOLED_DECAY = 0.99  # the pooled counts (every sequence's prior) fade slower
PRIOR_WEIGHT = 2.0  # rounds' worth of weight the prior carries in a sequence's estimate
PRIOR_RATE = 0.5  # the prior before any round was verified
PROBE_EVERY = 16  # rounds without drafting after which a sequence drafts one token again
PROBE_MAX = 256  # the longest wait between probes
WINDOW = 64  # recent rounds the timing estimates take medians over (a stall moves no median)


@dataclass
class Acceptance:
    """Decayed counts by draft position i (0-based): rounds that verified position i after
    accepting every earlier one (`reached`), and those that accepted it too."""

    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    idle_rounds: int = 0  # rounds since this sequence last drafted
    probe_after: int = PROBE_EVERY  # idle rounds before its next probe

    def __post_init__(self) -> None:
        assert len(self.reached) == len(self.accepted)

    def record(self, num_draft_tokens: int, num_accepted: int, decay: float = DECAY) -> None:
        assert 0 <= num_accepted <= num_draft_tokens
        grow = num_draft_tokens - len(self.reached)
        if grow > 0:
            self.reached += [0.0] * grow
            self.accepted += [0.0] * grow
        self.reached = [r * decay for r in self.reached]
        self.accepted = [a * decay for a in self.accepted]
        for i in range(min(num_accepted + 1, num_draft_tokens)):
            self.reached[i] += 1.0
            self.accepted[i] += float(i < num_accepted)

    def rate(self, i: int, prior: float, weight: float = PRIOR_WEIGHT) -> float:
        """P(position i accepted | positions < i accepted), shrunk toward `prior`."""
        reached = self.reached[i] if i < len(self.reached) else 0.0
        accepted = self.accepted[i] if i < len(self.accepted) else 0.0
        return (accepted + prior * weight) / (reached + weight)


def expected_gains(acc: Acceptance, pooled: Acceptance, cap: int) -> list[float]:
    """[cap + 1]: the expected tokens a round of draft length k emits, k = 0..cap."""
    gains, reach = [1.0], 1.0
    for i in range(cap):
        reach *= acc.rate(i, pooled.rate(i, PRIOR_RATE))
        gains.append(gains[-1] + reach)
    return gains


class RoundTimes:
    """What recent rounds cost beyond their forward step, by their draft tokens d: a + b d, from
    the medians of each d's rounds (verification, sampling and features grow with the rows)."""

    def __init__(self):
        self.samples: deque[tuple[int, float]] = deque(maxlen=WINDOW)

    def add(self, draft_tokens: int, seconds: float) -> None:
        self.samples.append((draft_tokens, seconds))

    def fit(self) -> tuple[float, float]:
        """(a, b) in seconds: a round's own cost, and each draft token's beyond its row's forward."""
        by: dict[int, list[float]] = {}
        for d, s in self.samples:
            by.setdefault(d, []).append(s)
        if not by:
            return 0.0, 0.0
        points = [(d, statistics.median(v), len(v)) for d, v in by.items()]
        n = sum(w for _, _, w in points)
        mean_d, mean_s = sum(d * w for d, _, w in points) / n, sum(m * w for _, m, w in points) / n
        var = sum(w * (d - mean_d) ** 2 for d, _, w in points)
        b = max(0.0, sum(w * (d - mean_d) * (m - mean_s) for d, m, w in points) / var) if var else 0.0
        return max(0.0, mean_s - b * mean_d), b


def length_policy(target, draft, config) -> "LengthPolicy | None":
    """The router's policy where its limits ask for adaptive lengths (RouterLimits.adaptive), a draft
    pool exists and the target pool can tell its step costs; else None (configured lengths)."""
    if not config.adaptive or draft is None or not hasattr(target, "row_costs"):
        return None
    return LengthPolicy(RowCosts(tuple(target.row_costs())), config.model_tokens)


class LengthPolicy:
    """Chooses the draft lengths of a round (see the module docstring)."""

    def __init__(self, costs: RowCosts, model_tokens: int | None = None):
        self.costs = costs
        self.model_tokens = model_tokens  # draft-model steps a round runs at most (lookup first); None: k
        self.draft_steps_seen: deque[float] = deque(maxlen=WINDOW)  # seconds of one draft-model step
        self.round_times = RoundTimes()
        self._fit = (0.0, 0.0)  # round_times' (a, b), refitted as rounds come in
        self.pooled = Acceptance()  # every sequence's rounds: the prior of a sequence's own rates

    def _draft_steps(self, longest: int) -> int:
        return longest if self.model_tokens is None else min(longest, self.model_tokens)

    def _round_cost(self, base_rows: int, draft_tokens: int, longest: int, draft_step: float | None = None) -> float:
        """Seconds of a round whose step holds base_rows + draft_tokens rows and whose longest
        proposal is `longest` tokens (`draft_step`: draft_step_seconds, taken once by callers that
        price many rounds)."""
        fixed, per_token = self._fit
        draft_step = self.draft_step_seconds if draft_step is None else draft_step
        return (fixed + per_token * draft_tokens + self.costs.step_seconds(base_rows + draft_tokens)
                + draft_step * self._draft_steps(longest))

    @property
    def draft_step_seconds(self) -> float:
        return statistics.median(self.draft_steps_seen) if self.draft_steps_seen else 0.0

    def lengths(self, seqs: list[tuple[Acceptance, int]], base_rows: int) -> list[int]:
        """seqs: each drafting candidate's acceptance and its length cap; base_rows: the rows the
        step holds without any draft token (one a decoding sequence, a prefill's prompt).

        A draft token's gain (the chance it is emitted) never grows along a sequence's chain, so
        the best K draft tokens of a round are the K largest gains; the round takes the K with the
        most tokens per cost (exact for one sequence; for a batch the draft's depth is charged as
        the chosen tokens reach it)."""
        gains = [expected_gains(acc, self.pooled, cap) for acc, cap in seqs]
        marginals = sorted(((g[j] - g[j - 1], j, i) for i, g in enumerate(gains) for j in range(1, len(g))),
                           key=lambda m: (-m[0], m[1]))
        draft_step = self.draft_step_seconds
        best_value, best_count = len(seqs) / self._round_cost(base_rows, 0, 0, draft_step), 0
        total, depth = float(len(seqs)), 0
        for count, (gain, j, _) in enumerate(marginals, start=1):
            total, depth = total + gain, max(depth, j)
            value = total / self._round_cost(base_rows, count, depth, draft_step)
            if value > best_value:
                best_value, best_count = value, count
        ks = [0] * len(seqs)
        for _, j, i in marginals[:best_count]:
            ks[i] = max(ks[i], j)
        return [self._probe(acc, k, cap) for (acc, cap), k in zip(seqs, ks)]

    def value(self, seqs: list[tuple[Acceptance, int]], lengths: list[int], base_rows: int) -> float:
        """Expected tokens per second of a round drafting `lengths` (tests compare choices with it)."""
        gains = [expected_gains(acc, self.pooled, cap)[k] for (acc, cap), k in zip(seqs, lengths)]
        return sum(gains) / self._round_cost(base_rows, sum(lengths), max(lengths, default=0))

    @staticmethod
    def _probe(acc: Acceptance, k: int, cap: int) -> int:
        if k > 0 or cap == 0:
            acc.idle_rounds = 0
            acc.probe_after = PROBE_EVERY if k > 0 else acc.probe_after
            return k
        acc.idle_rounds += 1
        if acc.idle_rounds < acc.probe_after:
            return 0
        acc.idle_rounds, acc.probe_after = 0, min(2 * acc.probe_after, PROBE_MAX)
        return 1

    def record(self, acc: Acceptance, num_draft_tokens: int, num_accepted: int) -> None:
        acc.record(num_draft_tokens, num_accepted)
        self.pooled.record(num_draft_tokens, num_accepted, POOLED_DECAY)

    def observe(self, rows: int, round_seconds: float, draft_seconds: float | None, lengths: list[int]) -> None:
        """A finished round without a prefill: its step's rows, its wall time and the draft's part
        (None where the draft caught up on more tokens than a round commits: that cost is not a
        draft step's). What the forward of its rows does not explain is the round's own cost: the
        worker's verification and sampling, hops, the router."""
        if draft_seconds is None:
            return
        self.round_times.add(sum(lengths), round_seconds - draft_seconds - self.costs.step_seconds(rows))
        self._fit = self.round_times.fit()
        steps = self._draft_steps(max(lengths, default=0))
        if steps:
            self.draft_steps_seen.append(draft_seconds / steps)
