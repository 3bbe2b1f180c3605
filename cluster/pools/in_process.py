"""Pools whose workers run in this process: the in-process API (`LLM`), tests, and the inline
draft transport (the draft worker in the router's process)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from specray.actors.messages import DraftItem, TargetItem
from specray.cluster.pools.api import Done
from specray.cluster.pools.draft_endpoint import TransportStats
from specray.kernels.proposal import Proposal, VerifyResult


T = TypeVar("T")


class Deferred(Generic[T]):
    """A call made when its result is first asked for. An in-process step so runs after the router's
    `after_submit` hook, and the outputs that hook hands to the event loops stream while the step
    computes (its C kernels release the GIL), as they do beside a worker in another process."""

    def __init__(self, call: Callable[[], T]):
        self._call: Callable[[], T] | None = call
        self._done: Done[T] = Done()

    def result(self) -> T:
        if self._call is not None:
            call, self._call = self._call, None
            try:
                self._done = Done(call())
            except Exception as e:  # noqa: BLE001 - raised to every caller of result, as Done does
                self._done = Done(error=e)
        return self._done.result()


class InProcessTargetPool:
    """A TargetWorker in this process."""

    def __init__(self, worker):
        self.worker = worker
        self._submitted: Deferred | None = None  # the latest step, perhaps not run yet

    def submit_step(self, items: list[TargetItem]) -> Deferred[list[VerifyResult]]:
        self._submitted = Deferred(lambda: self.worker.step(items))
        return self._submitted

    def release(self, seq_id: object) -> None:
        """After the submitted step has run: a sequence aborted between two pipelined slots would
        otherwise be released before the step that creates its KV, which nothing frees later."""
        if self._submitted is not None:
            try:
                self._submitted.result()
            except Exception:  # noqa: BLE001 - kept for the step's collector, which raises it
                pass
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
