"""Pools whose workers run in this process: the in-process API (`LLM`), tests, and the inline
draft transport (the draft worker in the router's process)."""

from __future__ import annotations

import time

from specray.actors.messages import DraftItem, TargetItem
from specray.cluster.pools.api import Done
from specray.cluster.pools.draft_endpoint import TransportStats
from specray.kernels.proposal import Proposal, VerifyResult


class InProcessTargetPool:
    """A TargetWorker in this process."""

    def __init__(self, worker):
        self.worker = worker

    def submit_step(self, items: list[TargetItem]) -> Done[list[VerifyResult]]:
        return Done(self.worker.step(items))

    def release(self, seq_id: object) -> None:
        self.worker.release(seq_id)

    def ready(self) -> bool:
        return True

    def busy(self) -> float:
        return self.worker.busy()

    def row_costs(self) -> tuple[float, ...]:
        return self.worker.row_costs()


class InProcessDiffusionPool(InProcessTargetPool):
    """A DiffusionWorker in this process."""

    def submit_step(self, new, seq_ids: list[object]) -> Done:
        return Done(self.worker.step(new, seq_ids))


class InProcessDraftPool:
    """A DraftWorker in this process."""

    def __init__(self, worker):
        self.worker = worker

    def submit_propose(self, items: list[DraftItem]) -> Done[list[Proposal]]:
        return Done(self.worker.propose(items))

    def release(self, seq_id: object) -> None:
        self.worker.release(seq_id)


class InlineDraftPool(InProcessDraftPool):
    """transport.kind inline: the draft worker in the router's process. Proposals cost no actor
    call (docs/performance.md has its cost); the draft's compute runs on the router's cores."""

    def __init__(self, worker):
        super().__init__(worker)
        self.stats = TransportStats()  # no bytes travel; seconds are the draft's compute

    def ready(self) -> bool:
        return True

    def submit_propose(self, items):
        start = time.perf_counter()
        done = super().submit_propose(items)
        self.stats.record(0, 0, time.perf_counter() - start)
        return done
