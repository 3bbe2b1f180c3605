"""A diffusion LM's worker as a Ray actor (the target pool's place; there is no draft pool: FreeDave
drafts from the model itself). A worker that dies loses its canvases: the pending step raises
TargetUnavailable and a fresh worker starts at once."""

from __future__ import annotations

import logging
import uuid

import ray

from specray.actors.diffusion_worker import DiffusionWorker
from specray.actors.specs import DiffusionSpec
from specray.cluster.pools.api import TargetUnavailable
from specray.cluster.pools.builder import kill_worker, release_group, reserve, start_worker
from specray.cluster.pools.ray_pending import RayPending, Starting
from specray.cluster.pools.ray_pools import Placement

log = logging.getLogger("specray.pools")


class RayDiffusionPool:
    def __init__(self, spec: DiffusionSpec, placement: Placement = Placement({"target": 1}),
                 timeout_s: float | None = None):
        self.spec, self.placement = spec, placement
        self.timeout_s = timeout_s  # a call past it: the worker counts as lost (hung, or its node gone)
        self.name = f"specray-diffusion-{uuid.uuid4().hex[:8]}"
        self.group = reserve([placement.bundle()])
        self.starts, self.starting = 0, Starting()
        self.actor = self._start()

    def _start(self):
        self.starts += 1
        return start_worker(DiffusionWorker.from_spec, self.spec, self.group, self.placement,
                            name=f"{self.name}-s{self.starts}")

    def submit_step(self, new, seq_ids: list[object]) -> RayPending:
        self.starting.wait(self.ready, self._failed)
        return RayPending([self.actor.call.remote("step", new, seq_ids)], self._failed, self.timeout_s)

    def _failed(self, error: Exception) -> TargetUnavailable:
        kill_worker(self.actor)
        self.actor, self.starting = self._start(), Starting()
        log.error("the diffusion worker failed; restarting it", exc_info=error)
        return TargetUnavailable("the diffusion worker failed and is restarting; its requests were lost, retry them")

    def release(self, seq_id) -> None:
        self.actor.call.remote("release", seq_id)  # fire and forget; ordered after in-flight steps

    def busy(self) -> float:
        return ray.get(self.actor.call.remote("busy"))

    def node_ids(self) -> list[str]:
        return [ray.get(self.actor.node_id.remote())]

    def close(self) -> None:
        kill_worker(self.actor)
        release_group(self.group)

    def ready(self, timeout_s: float = 300.0) -> None:
        ray.get(self.actor.call.remote("ping"), timeout=timeout_s)
