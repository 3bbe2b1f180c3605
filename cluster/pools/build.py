"""Start the pools a ServeConfig asks for on the connected Ray cluster, with its draft transport."""

from __future__ import annotations

from dataclasses import replace

from specray.cluster.config.pools import PoolConfig
from specray.cluster.config.serve import ServeConfig
from specray.cluster.config.worker_specs import serve_draft_spec, serve_target_spec
from specray.cluster.pools.compute_thread import OnComputeThread
from specray.cluster.pools.ray_pools import Placement, RayDraftPool, RayTargetPool


def placement(pool: PoolConfig) -> Placement:
    return Placement(dict(pool.resources), pool.num_cpus, pool.num_gpus)


def build_target_pool(cfg: ServeConfig, colocated: bool = False):
    """Ray actors, or (`colocated`) the target worker in this process: the Serve replica's."""
    if colocated:
        from specray.actors.target_worker import TargetWorker
        from specray.cluster.pools.in_process import InProcessTargetPool

        return InProcessTargetPool(OnComputeThread(TargetWorker.from_spec, serve_target_spec(cfg)))
    return RayTargetPool(serve_target_spec(cfg), placement(cfg.pools.target), cfg.pools.target.num_workers,
                         channel=cfg.pools.channel == "auto", timeout_s=cfg.router.target_timeout_s)


def build_draft_pool(cfg: ServeConfig, colocated: bool = False):
    """The draft pool behind `transport.kind` (auto resolved; ray, grpc, torch_distributed, inline); None without
    speculation. `colocated` moves a 'ray' draft worker into this process, as 'inline' does."""
    spec = serve_draft_spec(cfg)
    if spec is None:
        return None
    kind, timeout = cfg.draft_transport, cfg.router.draft_timeout_s
    if kind == "inline" or (colocated and kind == "ray"):
        from specray.actors.draft_worker import DraftWorker
        from specray.cluster.pools.in_process import InlineDraftPool

        if colocated:  # its threads are the process's, which the target's worker set
            spec = replace(spec, threads=None)
        return InlineDraftPool(OnComputeThread(DraftWorker.from_spec, spec))
    if kind == "grpc":
        from specray.cluster.pools.grpc_transport import GrpcDraftPool

        return GrpcDraftPool(cfg.transport.drafter_address, timeout, cfg.speculative.method, target_vocab(cfg))
    if kind == "torch_distributed":
        from specray.cluster.pools.dist_transport import DistDraftPool

        return DistDraftPool(spec, placement(cfg.pools.draft), timeout, cfg.transport.master_port)
    return RayDraftPool(spec, placement(cfg.pools.draft), timeout, cfg.pools.draft.num_workers,
                        channel=cfg.pools.channel == "auto")


def target_vocab(cfg) -> int:
    """The target's vocabulary size, which an external drafter's distributions must cover."""
    from specray.kernels.loader import resolve

    return int(resolve(cfg.model).hf_config().vocab_size)
