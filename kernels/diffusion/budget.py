"""How many drafts each sequence gets a round when FreeDave adapts (`DecodeOptions.adaptive`).

Draft k + 1 pays only if the chain reaches it, and every draft is a whole canvas to score: on a CPU,
where a call costs about its canvases' arithmetic, more drafts than the acceptance carries make
decoding slower than static. The budget picks, per sequence and round, the K <= num_drafts that
maximises expected static steps per second: steps E(K) = 1 + a + ... + a^(K-1) with a the
sequence's chance that the chain reaches one draft further (counted so far, prior 1/2), and seconds
= the call's fixed cost shared by the batch + K x the sequence's canvas cost (a least-squares fit of
the engine's calls, seconds on canvas tokens). While recent calls were all of one size the fit cannot
tell the two parts apart: the budget then explores with two drafts (old calls decay, so it looks
again from time to time). Whatever K it picks, the output is static decoding's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CallCost:
    """seconds ~ fixed + per_token x canvas tokens, fitted on recent calls (older ones decay)."""

    decay: float = 0.97
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def record(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self.n, self.sx, self.sy = d * self.n + 1, d * self.sx + tokens, d * self.sy + seconds
        self.sxx, self.sxy = d * self.sxx + tokens * tokens, d * self.sxy + tokens * seconds

    def separable(self) -> bool:
        """Whether recent calls varied enough in size (a 5 % spread of canvas tokens) to tell the
        fixed part from the per-token part."""
        if self.n < 2:
            return False
        mean = self.sx / self.n
        var = max(self.sxx / self.n - mean * mean, 0.0)
        return var > (0.05 * mean) ** 2

    def fit(self) -> tuple[float, float]:
        """(fixed seconds, seconds per canvas token); (0, mean) until the calls vary in size."""
        if self.n == 0:
            return 0.0, 1.0
        if not self.separable():
            return 0.0, self.sy / max(self.sx, 1.0)
        var = self.n * self.sxx - self.sx ** 2
        slope = (self.n * self.sxy - self.sx * self.sy) / var
        slope = max(slope, 1e-12)
        return max((self.sy - slope * self.sx) / self.n, 0.0), slope


@dataclass
class ChainOdds:
    """One sequence's record: how often the chain reached one draft further when it tried."""

    reached: int = 0
    tried: int = 0

    def record(self, drafts: int, accepted: int) -> None:
        """`accepted` of `drafts` drafts (>= 1: draft 1 always stands)."""
        self.reached += accepted - 1
        self.tried += accepted if accepted < drafts else drafts - 1

    @property
    def odds(self) -> float:
        return (self.reached + 1) / (self.tried + 2)


def best_num_drafts(odds: float, fixed_share: float, canvas_cost: float, max_drafts: int) -> int:
    """argmax over K in 1..max_drafts of E(K) / (fixed_share + K x canvas_cost)."""
    best, best_rate, steps, reach = 1, -1.0, 0.0, 1.0
    for k in range(1, max_drafts + 1):
        steps += reach
        reach *= odds
        rate = steps / (fixed_share + k * canvas_cost)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best
