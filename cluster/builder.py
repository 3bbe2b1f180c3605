"""The one module that applies Ray decorators: worker classes become actors here."""

from __future__ import annotations

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


class WorkerHost:
    """Builds a plain worker from its spec inside the actor's process and forwards calls to it."""

    def __init__(self, build, spec):
        self.worker = build(spec)

    def call(self, method: str, *args):
        return getattr(self.worker, method)(*args)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


RemoteWorkerHost = ray.remote(WorkerHost)


def reserve(resources: dict[str, float], num_cpus: float, timeout_s: float = 120.0) -> PlacementGroup:
    """A one-bundle placement group on a node that advertises `resources` (e.g. {"draft": 1})."""
    group = placement_group([{"CPU": num_cpus, **resources}], strategy="STRICT_PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(f"no node offers {resources} with {num_cpus} CPU within {timeout_s:.0f}s")
    return group


def start_worker(build, spec, group: PlacementGroup, num_cpus: float, max_restarts: int):
    """An actor hosting `build(spec)` inside `group`; Ray restarts it up to `max_restarts` times."""
    return RemoteWorkerHost.options(
        num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group),
    ).remote(build, spec)
