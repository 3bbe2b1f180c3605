"""Adaptive speculation length (speculative_config `adaptive: true`): each round, each sequence
proposes the number of draft tokens that maximises the tokens the round emits per unit of its cost.

A round of draft length k emits 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens on average, where a_i is
the chance that draft position i is accepted once the ones before it were (measured per sequence,
recent rounds weighing most). It costs the target's step of 1 + k rows (its shape by rows measured
by the target worker on this machine, kernels/row_costs.py, scaled to the steps the router times),
the draft's steps, and what the router's own part of a round costs (bookkeeping, detokenising): all
three timed by the router, round by round. Where no length beats k = 0 the sequence decodes without
a draft and drafts one token after `PROBE_EVERY` such rounds to measure its acceptance again, the
wait doubling (up to `PROBE_MAX`) while probes keep showing that drafting does not pay: a probe
costs the draft its catch-up on every token committed meanwhile.

Lossless: a round's length is chosen before the draft or the target sees the round, from earlier
rounds only, and verification is unchanged. Seeded sampled requests keep the configured length,
so their outputs repeat run to run (timings never steer which tokens they draw).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specray.kernels.row_costs import RowCosts

DECAY = 0.9  # a sequence's acceptance counts fade by this each round it drafts
POOLED_DECAY = 0.99  # the pooled counts (every sequence's prior) fade slower
PRIOR_WEIGHT = 2.0  # rounds' worth of weight the prior carries in a sequence's estimate
PRIOR_RATE = 0.5  # the prior before any round was verified
PROBE_EVERY = 16  # rounds without drafting after which a sequence drafts one token again
PROBE_MAX = 256  # the longest wait between probes
EMA = 0.2  # weight of the newest round in the draft-step and overhead estimates


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


class LengthPolicy:
    """Chooses the draft lengths of a round (see the module docstring)."""

    def __init__(self, costs: RowCosts, model_tokens: int | None = None):
        self.costs = costs
        self.model_tokens = model_tokens  # draft-model steps a round runs at most (lookup first); None: k
        self.draft_step_seconds = 0.0  # one draft-model step; 0 until measured
        self.step_scale = 0.0  # the timed target step / the measured forward of its rows; 0 until timed
        self.overhead_seconds = 0.0  # a round's time outside both pools' calls; 0 until measured
        self.pooled = Acceptance()  # every sequence's rounds: the prior of a sequence's own rates

    def _draft_steps(self, longest: int) -> int:
        return longest if self.model_tokens is None else min(longest, self.model_tokens)

    def _round_cost(self, base_rows: int, draft_tokens: int, longest: int) -> float:
        """Seconds of a round whose step holds base_rows + draft_tokens rows and whose longest
        proposal is `longest` tokens."""
        step = (self.step_scale or 1.0) * self.costs.step_seconds(base_rows + draft_tokens)
        return self.overhead_seconds + step + self.draft_step_seconds * self._draft_steps(longest)

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
        best_value, best_count = len(seqs) / self._round_cost(base_rows, 0, 0), 0
        total, depth = float(len(seqs)), 0
        for count, (gain, j, _) in enumerate(marginals, start=1):
            total, depth = total + gain, max(depth, j)
            value = total / self._round_cost(base_rows, count, depth)
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

    def observe(self, rows: int, round_seconds: float, target_seconds: float, draft_seconds: float | None,
                lengths: list[int]) -> None:
        """A finished round without a prefill: its step's rows, its wall time and each pool's part
        (the draft's None where it caught up on more tokens than a round commits: that cost is
        not a draft step's)."""
        if target_seconds > 0:
            self.step_scale = _ema(self.step_scale, target_seconds / self.costs.step_seconds(rows))
        if draft_seconds is None:
            return
        self.overhead_seconds = _ema(self.overhead_seconds, max(0.0, round_seconds - target_seconds - draft_seconds))
        steps = self._draft_steps(max(lengths, default=0))
        if steps:
            self.draft_step_seconds = _ema(self.draft_step_seconds, draft_seconds / steps)


def _ema(old: float, sample: float) -> float:
    return sample if old == 0.0 else (1 - EMA) * old + EMA * sample
