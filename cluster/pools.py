"""Draft and target pools on Ray: workers in placement groups on nodes that advertise the `draft`
or `target` resource. They implement the engine's TargetPool / DraftPool protocols, so the
in-process engine drives them unchanged.

A draft worker that dies costs nothing but speed: `propose` raises DraftUnavailable, the engine
decodes target-only and resynchronises the draft from the full history once the restarted worker
answers a ping.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from specray.actors.draft_worker import DraftWorker
from specray.actors.specs import DraftSpec, TargetSpec
from specray.actors.target_worker import TargetWorker
from specray.cluster.builder import reserve, start_worker
from specray.cluster.engine import DraftUnavailable

ActorFailure = (RayActorError, GetTimeoutError)


@dataclass(frozen=True)
class Placement:
    resources: dict  # custom resources the node must advertise, e.g. {"target": 1}
    num_cpus: float = 1.0


class RayTargetPool:
    def __init__(self, spec: TargetSpec, placement: Placement = Placement({"target": 1})):
        self.group = reserve(placement.resources, placement.num_cpus)
        self.actor = start_worker(TargetWorker.from_spec, spec, self.group, placement.num_cpus, max_restarts=-1)

    def step(self, items):
        return ray.get(self.actor.call.remote("step", items))

    def release(self, seq_id) -> None:
        self.actor.call.remote("release", seq_id)  # fire and forget

    def node_id(self) -> str:
        return ray.get(self.actor.node_id.remote())


class RayDraftPool:
    def __init__(self, spec: DraftSpec, placement: Placement = Placement({"draft": 1}),
                 propose_timeout_s: float = 60.0):
        self.group = reserve(placement.resources, placement.num_cpus)
        self.actor = start_worker(DraftWorker.from_spec, spec, self.group, placement.num_cpus, max_restarts=-1)
        self.propose_timeout_s = propose_timeout_s
        self._revival = None  # a pending ping while the worker is down

    @property
    def healthy(self) -> bool:
        if self._revival is None:
            return True
        done, _ = ray.wait([self._revival], timeout=0)
        if not done:
            return False
        try:
            ray.get(self._revival)
            self._revival = None
            return True
        except ActorFailure:
            self._revival = self.actor.node_id.remote()
            return False

    def propose(self, items):
        if not self.healthy:
            raise DraftUnavailable("draft worker is restarting")
        try:
            return ray.get(self.actor.call.remote("propose", items), timeout=self.propose_timeout_s)
        except ActorFailure as e:
            self._revival = self.actor.node_id.remote()  # answers once Ray has restarted the worker
            raise DraftUnavailable(str(e)) from None

    def release(self, seq_id) -> None:
        if self._revival is None:
            self.actor.call.remote("release", seq_id)

    def node_id(self) -> str:
        return ray.get(self.actor.node_id.remote())
