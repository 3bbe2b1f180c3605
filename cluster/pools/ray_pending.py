"""A pending answer of one Ray worker, or of every tensor-parallel rank, and what a rank's failure
means: a bad request (every rank raised alike) or a lost worker (the pool restarts it)."""

from __future__ import annotations

import time

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

ActorFailure = (RayActorError, GetTimeoutError)
RANK_GRACE_S = 5.0  # a rank still busy this long after another raised is stuck in a collective
START_TIMEOUT_S = 300.0  # a (re)started worker answers within this once its weights load (pool.ready's bound)


class RayPending:
    """An ObjectRef (or several, one per tensor-parallel rank) and what a failure means."""

    def __init__(self, refs: list, on_failure, timeout_s: float | None = None, on_result=None):
        self.refs, self.on_failure, self.timeout_s, self.on_result = refs, on_failure, timeout_s, on_result

    def result(self):
        try:
            value = self._first_rank()
        except ActorFailure as e:
            raise self.on_failure(e) from None
        return value if self.on_result is None else self.on_result(value)

    def _first_rank(self):
        """Rank 0's value once every rank answered (they agree). A rank that died raises at once:
        the others may be waiting for it in a collective and would only time out."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        waiting, succeeded = list(self.refs), 0
        while waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, waiting = ray.wait(waiting, num_returns=1, timeout=left)
            if not ready:
                raise GetTimeoutError(f"no answer within {self.timeout_s}s")
            try:
                ray.get(ready[0])
                succeeded += 1
            except RayTaskError:
                self._check_in_step(waiting, succeeded)
                raise
        return ray.get(self.refs[0])

    @staticmethod
    def _check_in_step(waiting: list, succeeded: int) -> None:
        """A rank raised. Ranks that run the same code on the same input raise alike (a bad request:
        the router isolates it). A rank still busy after a grace period is stuck in a collective the
        failed rank left, and a rank that succeeded has committed what the failed one has not (a
        rank-local fault such as OOM after the last collective): either way the group must restart."""
        if waiting and ray.wait(waiting, num_returns=len(waiting), timeout=RANK_GRACE_S)[1]:
            raise GetTimeoutError("one rank failed while the others wait for it")
        if succeeded or any(map(_answered, waiting)):
            raise GetTimeoutError("one rank failed where another succeeded: their caches differ")


def _answered(ref) -> bool:
    """A finished rank's call returned (rather than raised)."""
    try:
        ray.get(ref)
        return True
    except RayTaskError:
        return False


class Starting:
    """Whether a pool's workers may still be loading: the first step after a (re)start waits for
    them apart, so a step's timeout bounds the step and not a load (a restarted worker whose load
    outlasted target_timeout_s was killed again, and again)."""

    def __init__(self):
        self.pending = True

    def wait(self, ready, on_failure) -> None:
        """`ready(timeout_s)` once after each start; a worker lost meanwhile raises `on_failure(error)`."""
        if not self.pending:
            return
        try:
            ready(START_TIMEOUT_S)
        except RayError as e:  # dead, not up in time, or its start failed otherwise: start afresh
            raise on_failure(e) from None
        self.pending = False
