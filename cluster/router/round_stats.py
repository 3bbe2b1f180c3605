"""Where a round's time goes: the router's waits on each pool, and (for pools in other processes)
how much of each wait their worker computed. Benchmarks take a snapshot before and after a run."""

from __future__ import annotations

import time


def busy_seconds(pool) -> float | None:
    """Seconds the pool's worker spent computing; None where the router's wait is that (in this
    process, or a transport that does not report it)."""
    busy = getattr(pool, "busy", None)  # None for a missing pool too
    return None if busy is None else busy()


def snapshot(router) -> dict:
    stats = router.stats
    return {"time": time.perf_counter(), "steps": stats.steps, "target_wait": stats.target_seconds,
            "draft_wait": stats.draft_seconds, "target_compute": busy_seconds(router.target),
            "draft_compute": busy_seconds(router.draft)}


def breakdown(before: dict, after: dict) -> dict:
    """Milliseconds a round between two snapshots; the router's share is what no pool explains."""
    rounds = max(1, after["steps"] - before["steps"])

    def ms(key: str) -> float | None:
        if after[key] is None:
            return None
        return round(1000 * (after[key] - before[key]) / rounds, 3)

    wall, target_wait, draft_wait = ms("time"), ms("target_wait"), ms("draft_wait")
    target_compute, draft_compute = ms("target_compute"), ms("draft_compute")
    return {"rounds": rounds, "wall": wall, "target_wait": target_wait, "draft_wait": draft_wait,
            "target_compute": target_wait if target_compute is None else target_compute,
            "draft_compute": draft_wait if draft_compute is None else draft_compute,
            "router": round(wall - target_wait - draft_wait, 3)}
