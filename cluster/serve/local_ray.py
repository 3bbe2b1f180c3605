"""The Ray cluster `specray serve` runs on: the one it is told to join, or a new one on this machine
that advertises the custom resources the pools ask for."""

from __future__ import annotations

import os

# Settings of a cluster `specray serve` starts for itself (one node, one replica), for the processes
# it spawns; a value already in the environment wins. Serve's controller reconciles every 0.1 s by
# default, each pass asking the GCS for every node's resources: on a 2-core node the two took 2-3 %
# of the cores while idle (docs/performance.md). Every 0.5 s a lost replica is still replaced within
# a second; a cluster specray joins keeps its own settings.
LOCAL_CLUSTER_ENV = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5"}


def local_resources(cfg) -> dict[str, float]:
    """Custom resources a one-machine cluster must advertise for the pools to place."""
    need: dict[str, float] = {}
    pools = [(cfg.pools.target, cfg.pools.target.num_workers)]
    if cfg.speculative is not None and cfg.draft_transport not in ("grpc", "inline"):  # no draft actor
        pools.append((cfg.pools.draft, cfg.pools.draft.num_workers))
    for pool, count in pools:
        for name, amount in pool.resources.items():
            need[name] = need.get(name, 0) + amount * count
    return need


def start_ray(cfg) -> None:
    import ray

    if ray.is_initialized():  # embedded in a process that already joined a cluster
        return
    if cfg.ray_address:
        try:
            ray.init(address=cfg.ray_address)
        except ConnectionError as e:
            raise ValueError(f"--address {cfg.ray_address}: no Ray cluster answers there ({e})") from None
        return
    pools = [cfg.pools.target] * cfg.pools.target.num_workers + [cfg.pools.draft] * cfg.pools.draft.num_workers
    cpus = max(os.cpu_count() or 1, int(sum(p.num_cpus for p in pools) + 0.999))
    for name, value in LOCAL_CLUSTER_ENV.items():  # inherited by the raylet, hence by Serve's controller
        os.environ.setdefault(name, value)
    # "local": always a new cluster, never one some other job left running on this machine
    ray.init(address="local", num_cpus=cpus, resources=local_resources(cfg), include_dashboard=False)
