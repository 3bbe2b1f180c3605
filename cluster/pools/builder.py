"""The one module that applies Ray decorators: worker classes become actors and the serving
class becomes a Ray Serve deployment here."""

from __future__ import annotations

import pickle
import socket

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from specray.cluster.pools import compute_thread, local_channel
from specray.cluster.pools.compute_thread import OnComputeThread
from specray.cluster.pools.heap import freeze_startup_heap


class WorkerHost:
    """Builds a plain worker from its spec inside the actor's process and forwards calls to it, from
    Ray or from a same-node channel (cluster/pools/local_channel.py), on the process's compute
    thread (cluster/pools/compute_thread.py)."""

    def __init__(self, build, spec):
        self.worker = OnComputeThread(build, spec)
        self.channel = None
        freeze_startup_heap()

    def call(self, method: str, *args):
        return getattr(self.worker, method)(*args)

    def call_packed(self, method: str, payload: bytes) -> bytes:
        """`call` with arguments and result as local_channel.dumps bytes: Ray pickles a tensor
        through torch.save per storage, 10x slower on a round's results."""
        return local_channel.dumps(self.call(method, *pickle.loads(payload)))

    def open_channel(self) -> tuple[str, bytes] | None:
        """The address and auth key of this worker's channel; None where the platform has none."""
        if not local_channel.supported():
            return None
        if self.channel is None:  # its calls are read and answered on the compute thread
            self.channel = local_channel.ChannelServer(self.call, watch=compute_thread.watch)
        return self.channel.address, self.channel.authkey

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


RemoteWorkerHost = ray.remote(WorkerHost)


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("", 0))
        return f"tcp://{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"


def reserve(bundles: list[dict[str, float]], timeout_s: float = 120.0) -> PlacementGroup:
    """A placement group with one bundle per worker, e.g. [{"CPU": 1, "draft": 1}]."""
    group = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(f"no node offers {bundles} within {timeout_s:.0f}s: check the nodes' Ray "
                           "resources (e.g. --resources='{\"target\": 1}')")
    return group


def _strategy(group: PlacementGroup, bundle_index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=bundle_index)


def rendezvous_probe(group: PlacementGroup, bundle_index: int = 0) -> ray.ObjectRef:
    """A ref to tcp://ip:port free on the node that holds `bundle_index` (torch.distributed
    rendezvous): a task in a worker process that may take seconds to start, so callers that must
    not block wait on the ref."""
    probe = ray.remote(_free_address).options(num_cpus=0, scheduling_strategy=_strategy(group, bundle_index))
    return probe.remote()


def rendezvous_address(group: PlacementGroup, bundle_index: int = 0) -> str:
    """`rendezvous_probe`'s address, waited for."""
    return ray.get(rendezvous_probe(group, bundle_index))


def start_worker(build, spec, group: PlacementGroup, placement, bundle_index: int = 0, max_restarts: int = 0,
                 name: str | None = None):
    """An actor hosting `build(spec)` in one bundle of `group`; Ray restarts it up to `max_restarts`.
    Named, so that operators find it with `ray list actors` and `ray.get_actor`."""
    return RemoteWorkerHost.options(
        name=name, num_cpus=placement.num_cpus, num_gpus=placement.num_gpus, resources=dict(placement.resources),
        max_restarts=max_restarts, max_task_retries=0, scheduling_strategy=_strategy(group, bundle_index),
    ).remote(build, spec)


def _true(*_) -> bool:
    return True


def all_of(refs: list):
    """A ref that resolves once every ref in `refs` has (Ray resolves top-level ref arguments first)."""
    return ray.remote(_true).options(num_cpus=0).remote(*refs)


def kill_worker(actor) -> None:
    ray.kill(actor, no_restart=True)


def release_group(group: PlacementGroup) -> None:
    ray.util.remove_placement_group(group)


def namespace() -> str:
    return ray.get_runtime_context().namespace


def replica_resources(cfg) -> dict:
    """What the replica reserves: nothing, or with `pools.colocate` the workers it runs (a draft
    worker only where it would have been a Ray actor)."""
    pools = cfg.pools
    if pools.colocate is not True:
        return {"num_cpus": 0}
    hosted = [pools.target] + ([pools.draft] if cfg.speculative is not None and cfg.draft_transport == "ray" else [])
    resources: dict[str, float] = {}
    for pool in hosted:
        for name, amount in pool.resources.items():
            resources[name] = resources.get(name, 0) + amount
    return {"num_cpus": sum(p.num_cpus for p in hosted), "num_gpus": sum(p.num_gpus for p in hosted),
            "resources": resources}


def serve_deployment(server_cls, cfg):
    """The Serve deployment around `server_cls` (an ASGI ingress built at replica start).

    One replica: the router owns the running batch. It reserves no CPU so it fits beside the
    pools on small clusters (with `pools.colocate`, what the workers it hosts would), and takes as
    many requests as the router may run and queue (each is at least one sequence). Beyond that the
    proxy queues at most `max_waiting` more and answers 429.
    """
    from ray import serve
    from ray.serve.config import BackpressureConfig

    r = cfg.router
    return serve.deployment(
        serve.ingress()(server_cls), name="specray", num_replicas=1,
        max_ongoing_requests=r.max_waiting + r.max_num_seqs, max_queued_requests=r.max_waiting,
        backpressure_config=BackpressureConfig(status_code=429, retry_after_s=1),
        ray_actor_options=replica_resources(cfg), health_check_period_s=10, health_check_timeout_s=30,
    )
