"""Draft and target pools on Ray: workers in placement groups on nodes that advertise the `draft`
or `target` resource (or GPUs). They implement `pool_api`'s TargetPool / DraftPool, so the router
drives them exactly as it drives in-process workers.

A draft worker that dies costs nothing but speed: the pending proposal raises DraftUnavailable,
the router decodes target-only and resynchronises the draft from the full history once Ray has
restarted the worker. A target worker that dies loses its KV cache: the pending step raises
TargetUnavailable (the router fails the requests whose output began with a retryable error and runs
the others again) and the pool starts fresh workers at once, so the service recovers without a restart.
"""

from __future__ import annotations

import logging
import pickle
import time
import uuid
from dataclasses import dataclass, replace

import ray
from ray.exceptions import RayTaskError

from specray.actors.specs import DraftSpec, TargetSpec
from specray.actors.target_worker import TargetWorker
from specray.cluster.pools import wire
from specray.cluster.pools.api import DraftUnavailable, TargetUnavailable
from specray.cluster.pools.builder import (all_of, kill_worker, release_group, rendezvous_address, rendezvous_probe,
                                          reserve, start_worker)
from specray.cluster.pools.draft_endpoint import DraftEndpoint, TransportStats
from specray.cluster.pools.local_channel import ChannelPending, dumps
from specray.cluster.pools.ray_pending import ActorFailure, RayPending, Starting
from specray.cluster.pools.worker_calls import WorkerCalls

log = logging.getLogger("specray.pools")



@dataclass(frozen=True)
class Placement:
    resources: dict  # custom resources each worker's node must advertise, e.g. {"target": 1}
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def bundle(self) -> dict:
        gpus = {"GPU": self.num_gpus} if self.num_gpus else {}
        return {"CPU": self.num_cpus, **gpus, **self.resources}


class RayTargetPool:
    """The target: one worker, or `spec.tp_size` tensor-parallel ranks that all run every step."""

    def __init__(self, spec: TargetSpec, placement: Placement = Placement({"target": 1}), tp_size: int = 1,
                 channel: bool = True, timeout_s: float | None = None):
        self.spec, self.placement, self.tp_size = spec, placement, tp_size
        self.timeout_s = timeout_s  # a step past it: the worker counts as lost (hung, or its node gone)
        self.name = f"specray-target-{uuid.uuid4().hex[:8]}"
        self.group = reserve([placement.bundle()] * tp_size)
        self.starts, self.starting = 0, Starting()
        self.actors = self._start()
        self.calls = WorkerCalls(channel and tp_size == 1)  # ranks agree through Ray's refs

    def _start(self) -> list:
        specs = [self.spec]
        if self.tp_size > 1:  # a fresh rendezvous each start, so restarted ranks never meet stale ones
            address = rendezvous_address(self.group)
            specs = [replace(self.spec, tp_rank=r, tp_size=self.tp_size, dist_init_method=address)
                     for r in range(self.tp_size)]
        self.starts += 1
        return [start_worker(TargetWorker.from_spec, s, self.group, self.placement, bundle_index=r,
                             name=f"{self.name}-s{self.starts}-r{r}") for r, s in enumerate(specs)]

    def submit_step(self, items) -> RayPending | ChannelPending:
        self.starting.wait(self.ready, self._failed)
        pending = self.calls.submit(self.actors[0], "step", items, on_failure=self._failed,
                                    timeout_s=self.timeout_s)
        if pending is not None:
            return pending
        payload = dumps((items,))  # the results' tensors as raw bytes, as over a channel
        ref = ray.put(payload) if self.tp_size > 1 else payload
        return RayPending([a.call_packed.remote("step", ref) for a in self.actors], self._failed, self.timeout_s,
                           on_result=pickle.loads)

    def _failed(self, error: Exception) -> TargetUnavailable:
        self.calls.reset()
        for actor in self.actors:  # a lost rank strands the others mid-collective: restart all
            kill_worker(actor)
        self.actors, self.starting = self._start(), Starting()
        log.error("a target worker failed; restarting the target pool", exc_info=error)
        return TargetUnavailable("a target worker failed and is restarting; its requests were lost, retry them")

    def release(self, seq_id) -> None:
        for actor in self.actors:  # fire and forget; ordered after in-flight steps
            self.calls.send_no_reply(actor, "release", seq_id)

    def node_ids(self) -> list[str]:
        return ray.get([a.node_id.remote() for a in self.actors])

    def busy(self) -> float:
        """Seconds rank 0 spent in steps (benchmarks split a round's time with it)."""
        return self.calls.call(self.actors[0], "busy")

    def row_costs(self) -> tuple[float, ...]:
        """Seconds of a step by rows on the target's node (TargetWorker.row_costs); every rank steps."""
        if self.tp_size == 1:
            return self.calls.call(self.actors[0], "row_costs")
        return agreed_row_costs(lambda *call: ray.get([a.call.remote(*call) for a in self.actors]))

    def worker_names(self) -> list[str]:
        return [f"{self.name}-s{self.starts}-r{r}" for r in range(len(self.actors))]

    def close(self) -> None:
        self.calls.reset()
        for actor in self.actors:
            kill_worker(actor)
        release_group(self.group)

    def ready(self, timeout_s: float = 300.0) -> None:
        ray.get([a.call.remote("ping") for a in self.actors], timeout=timeout_s)


class RayDraftPool:
    """The draft worker as a Ray actor, or a layer-parallel draft group of `group_size` actors in one
    placement group joined by torch.distributed (EasySpec across devices: every rank receives every
    call, rank 0 answers). Items and proposals travel in wire format as object refs."""

    def __init__(self, spec: DraftSpec, placement: Placement = Placement({"draft": 1}),
                 propose_timeout_s: float = 60.0, group_size: int = 1, channel: bool = True):
        self.spec, self.placement, self.group_size = spec, placement, group_size
        self.calls = WorkerCalls(channel and group_size == 1)  # a group's ranks all receive each call
        self.group = reserve([placement.bundle()] * group_size)
        self.name = f"specray-draft-{uuid.uuid4().hex[:8]}"
        self.starts = 0
        self.actors = self._start(None if group_size == 1 else rendezvous_address(self.group))
        self.propose_timeout_s = propose_timeout_s
        self.stats = TransportStats()
        self._revival = None  # a pending ping while the worker (group) is down
        self._rendezvous = None  # a group's pending rendezvous address while it restarts
        # sequences that ended while the worker was down: one that timed out is still alive, with their state
        self._held_releases: list = []

    def _start(self, address: str | None) -> list:
        """One actor Ray restarts by itself, or a group started afresh (a new rendezvous `address`)
        each time: a restarted rank could not rejoin its old process group."""
        self.starts += 1
        if self.group_size == 1:
            return [start_worker(DraftEndpoint.from_spec, self.spec, self.group, self.placement, max_restarts=-1,
                                 name=self.name)]
        specs = [replace(self.spec, group_rank=r, group_size=self.group_size, dist_init_method=address)
                 for r in range(self.group_size)]
        return [start_worker(DraftEndpoint.from_spec, s, self.group, self.placement, bundle_index=r,
                             name=f"{self.name}-s{self.starts}-r{r}") for r, s in enumerate(specs)]

    @property
    def actor(self):
        """Rank 0."""
        return self.actors[0]

    def _restart_group(self) -> None:
        """Kill the ranks and ask for a fresh rendezvous; `healthy` starts the new group once the
        address is known, so the router's thread never waits for a worker process to start."""
        for actor in self.actors:
            kill_worker(actor)
        self.actors, self._revival, self._held_releases = [], None, []
        self._rendezvous = rendezvous_probe(self.group)

    def _down(self) -> bool:
        return self._revival is not None or self._rendezvous is not None

    @property
    def healthy(self) -> bool:
        if self._rendezvous is not None:
            self._start_restarted_group()
            return False  # its ranks answer a ping first
        if self._revival is None:
            return True
        done, _ = ray.wait([self._revival], timeout=0)
        if not done:
            return False
        try:
            ray.get(self._revival)
            self._revival = None
            return True
        except (RayTaskError, *ActorFailure):
            self._revive()  # a rank of the fresh group failed too: another fresh group
            return False

    def _start_restarted_group(self) -> None:
        """The fresh group's ranks, once its rendezvous address has arrived."""
        done, _ = ray.wait([self._rendezvous], timeout=0)
        if not done:
            return
        try:
            address = ray.get(self._rendezvous)
        except (RayTaskError, *ActorFailure):  # the probe's worker died: probe again
            self._rendezvous = rendezvous_probe(self.group)
            return
        self._rendezvous = None
        self.actors = self._start(address)
        self._revival = self._ping()

    def _revive(self) -> None:
        """A lone worker: wait for Ray's restart of it; a group: start afresh (the other ranks wait
        in a collective for the lost one)."""
        if self.group_size > 1:
            self._restart_group()
        else:
            self._revival = self._ping()

    def _ping(self):
        """An answer once every rank is up (Ray restarted the lone worker, or the new group joined)."""
        return self.actor.call.remote("ping") if self.group_size == 1 else \
            all_of([a.call.remote("ping") for a in self.actors])

    def submit_propose(self, items) -> RayPending:
        if not self.healthy:
            raise DraftUnavailable("draft worker is restarting", sent=False)
        if self._held_releases:
            held, self._held_releases = self._held_releases, []
            self._send_releases(held)
        payload, start = wire.encode_items(items), time.perf_counter()

        def decode(reply: bytes):
            self.stats.record(len(payload), len(reply), time.perf_counter() - start)
            return wire.decode_proposals(reply)

        pending = self.calls.submit(self.actor, "propose_bytes", payload, on_failure=self._failed,
                                    timeout_s=self.propose_timeout_s, on_result=decode)
        if pending is not None:
            return pending
        refs = [a.call.remote("propose_bytes", payload) for a in self.actors]
        return RayPending(refs, self._failed, self.propose_timeout_s, decode)

    def _failed(self, error: Exception) -> DraftUnavailable:
        self.calls.reset()
        self._revive()
        log.warning("the draft pool failed (%s); decoding target-only until it is back", type(error).__name__)
        return DraftUnavailable("draft worker is restarting")

    def release(self, seq_id) -> None:
        if self._down():
            self._held_releases.append(seq_id)
            return
        self._send_releases([seq_id])

    def _send_releases(self, seq_ids: list) -> None:
        for actor in self.actors:
            self.calls.send_no_reply(actor, "release_many", seq_ids)

    def node_id(self) -> str:
        return ray.get(self.actor.node_id.remote())

    def busy(self) -> float:
        """Seconds rank 0 spent answering proposals (benchmarks split a round's time with it)."""
        return self.calls.call(self.actor, "busy")

    def worker_names(self) -> list[str]:
        if self.group_size == 1:
            return [self.name]
        return [f"{self.name}-s{self.starts}-r{r}" for r in range(self.group_size)]

    def ready(self, timeout_s: float = 300.0) -> None:
        ray.get([a.call.remote("ping") for a in self.actors], timeout=timeout_s)

    def close(self) -> None:
        self.calls.reset()
        for actor in self.actors:
            kill_worker(actor)
        release_group(self.group)


def agreed_row_costs(every_rank) -> tuple[float, ...]:
    """Tensor-parallel ranks' step costs: the cached ones where every rank's node has them, else
    measured by all together (a rank measuring alone waits forever in its steps' collectives).
    `every_rank(method, *args)` calls a TargetWorker method on every rank -> the results by rank."""
    stored = every_rank("stored_row_costs")
    if all(s is not None for s in stored):
        return stored[0]
    return every_rank("row_costs", True)[0]
