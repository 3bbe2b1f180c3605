"""The pipelined router: two groups in flight, so neither pool waits for the other.

Each slot, the target pool verifies one group while the draft pool proposes for the other; then
they swap. A group's round is still propose -> verify -> commit in that order, so outputs are the
same as unpipelined rounds: pipelining changes when work runs, never what is computed.

    slot s:    target: verify(A)            draft: propose(B)
    slot s+1:  target: verify(B)            draft: propose(A)   (A's calibration rides on it)

Newly admitted sequences join the group about to be verified (their prefill needs no proposal),
sized to keep the two groups even; when finished sequences leave the groups uneven, the larger
drafting group hands a few sequences to the verifying group for one target-only round.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from specray.cluster.outputs import RequestOutput
from specray.cluster.pools.api import Pending
from specray.cluster.router.limits import RouterLimits
from specray.cluster.router.sequence import Sequence
from specray.kernels.ints import ceil_div
from specray.kernels.proposal import Proposal, VerifyResult


class RoundSteps(Protocol):
    """The router's half-rounds the pipeline interleaves (cluster/router/router.py implements them)."""

    config: RouterLimits
    running: list[Sequence]
    waiting: deque[Sequence]

    def admit(self, limit: int | None = None) -> list[Sequence]: ...
    def submit_verify(self, seqs: list[Sequence], proposals: dict[str, Proposal]) -> Pending[list[VerifyResult]]: ...
    def collect_verify(self, seqs: list[Sequence], pending: Pending[list[VerifyResult]],
                       proposals: dict[str, Proposal]) -> list[Sequence]: ...
    def submit_propose(self, seqs: list[Sequence]) -> Pending[dict[object, Proposal]] | None: ...
    def collect_proposals(self, seqs: list[Sequence], pending: Pending | None) -> dict[str, Proposal]: ...
    def news(self, seqs: list[Sequence]) -> list[RequestOutput]: ...


class Pipeline:
    def __init__(self, router: RoundSteps):
        self.router = router
        # the group on the target pool, with its proposals (a failed step is retried from them)
        self.verifying: tuple[list[Sequence], dict[str, Proposal], Pending] | None = None
        self.drafting: tuple[list[Sequence], Pending | None] | None = None  # group on the draft pool

    def reset(self) -> None:
        """Forget both groups (the target was lost). The draft reply still due is read first: over a
        transport that speaks in turns (torch.distributed) the next call's sends would otherwise meet
        the draft side blocked sending it, both ends waiting until the draft timeout."""
        if self.drafting is not None:
            self.router.collect_proposals(*self.drafting)  # a failed draft call costs speed, never raises
        self.verifying = self.drafting = None

    def slot(self) -> list[RequestOutput]:
        """Wait for both groups in flight, commit the verified one, and submit the next pair."""
        r = self.router
        committed = self._finish_verify()  # group A: committed, to be drafted next
        to_verify, proposals = self._finish_draft()  # group B: proposals ready
        # a part-prefilled prompt's next chunk needs no proposal: it rides in this slot's verify
        to_verify += [s for s in committed if s.prefilling]
        committed = [s for s in committed if not s.prefilling]
        to_verify += r.admit(limit=self._admission_limit(len(committed), len(to_verify)))
        moved = self._rebalance(committed, to_verify)
        committed = [s for s in committed if s not in moved]
        if to_verify:
            self.verifying = (to_verify, proposals, r.submit_verify(to_verify, proposals))
        if committed:
            self.drafting = (committed, r.submit_propose(committed))
        return r.news(self._touched)

    def _finish_verify(self) -> list[Sequence]:
        self._touched: list[Sequence] = []
        if self.verifying is None:
            return []
        seqs, proposals, pending = self.verifying
        self.verifying = None
        self._touched = self.router.collect_verify(seqs, pending, proposals)
        return [s for s in self._touched if s in self.router.running]

    def _finish_draft(self) -> tuple[list[Sequence], dict[str, Proposal]]:
        if self.drafting is None:
            return [], {}
        seqs, pending = self.drafting
        self.drafting = None
        proposals = self.router.collect_proposals(seqs, pending)
        return [s for s in seqs if s in self.router.running], proposals

    def _admission_limit(self, num_drafting: int, num_verifying: int) -> int:
        """Admit enough to bring the verifying group to half of everything that could run."""
        r = self.router
        room = max(0, r.config.max_num_seqs - len(r.running))
        total = num_drafting + num_verifying + min(room, len(r.waiting))
        return max(0, ceil_div(total, 2) - num_verifying)

    @staticmethod
    def _rebalance(drafting: list[Sequence], verifying: list[Sequence]) -> list[Sequence]:
        """Move sequences from a much larger drafting group into this slot's verify (target-only),
        never a seeded sampled one: a round without its drafts would draw differently, so its tokens
        would depend on what else runs (others finishing unbalance the groups)."""
        surplus = (len(drafting) - len(verifying)) // 2
        if surplus < 1 or len(drafting) - len(verifying) < 2:
            return []
        moved = [s for s in drafting if not s.reproducible][-surplus:]
        verifying.extend(moved)
        return moved
