"""Turn a ServeConfig into a running router: Ray pools (or an external gRPC drafter), the engine
and its asyncio driver. Used by the Serve deployment, and by tests and benchmarks directly."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from specray.actors.specs import DraftSpec, TargetSpec
from specray.cluster.async_engine import AsyncEngine
from specray.cluster.draft_endpoint import TransportStats
from specray.cluster.pool_api import InProcessDraftPool
from specray.cluster.engine import Engine, engine_config
from specray.cluster.serve_config import PoolConfig, ServeConfig
from specray.kernels.config import ModelConfig
from specray.kernels.loader import resolve


@dataclass
class Runtime:
    config: ServeConfig
    engine: Engine
    async_engine: AsyncEngine
    tokenizer: object
    target_pool: object
    draft_pool: object | None

    @property
    def api_key(self) -> str | None:
        http = self.config.http
        return http.api_key or (os.environ.get(http.api_key_env) if http.api_key_env else None) or None

    def shutdown(self) -> None:
        self.async_engine.shutdown()
        for pool in (self.draft_pool, self.target_pool):
            if hasattr(pool, "close"):
                pool.close()


def placement(pool: PoolConfig):
    from specray.cluster.pools import Placement

    return Placement(dict(pool.resources), pool.num_cpus, pool.num_gpus)


def num_blocks(cfg: ServeConfig) -> int:
    return -(-cfg.router.kv_cache_tokens // cfg.router.block_size)


def target_spec(cfg: ServeConfig) -> TargetSpec:
    p = cfg.pools.target
    return TargetSpec(cfg.model, p.dtype, p.device, num_blocks(cfg), cfg.router.block_size, p.threads)


def draft_spec(cfg: ServeConfig) -> DraftSpec | None:
    spec, p = cfg.speculative, cfg.pools.draft
    if spec is None:
        return None
    model = spec.model or (cfg.model if spec.method == "aded" else None)  # aded tokenizes with the target's
    return DraftSpec(spec.method, model, spec.draft_num_layers, spec.prompt_lookup_min, spec.prompt_lookup_max,
                     p.dtype, p.device, num_blocks(cfg), p.threads, tree=spec.tree, aded=spec.aded,
                     vocab_trim=spec.draft_vocab_trim, quantization=spec.draft_quantization,
                     lookup_first=spec.lookup_first)


def build_draft_pool(cfg: ServeConfig):
    spec = draft_spec(cfg)
    if spec is None:
        return None
    kind, timeout = cfg.transport.kind, cfg.router.draft_timeout_s
    if kind == "inline":
        from specray.actors.draft_worker import DraftWorker

        return InlineDraftPool(DraftWorker.from_spec(spec))
    if kind == "grpc":
        from specray.cluster.grpc_drafter import GrpcDraftPool

        return GrpcDraftPool(cfg.transport.drafter_address, timeout)
    if kind == "torch_distributed":
        from specray.cluster.dist_transport import DistDraftPool

        return DistDraftPool(spec, placement(cfg.pools.draft), timeout)
    from specray.cluster.pools import RayDraftPool

    return RayDraftPool(spec, placement(cfg.pools.draft), timeout)


class InlineDraftPool(InProcessDraftPool):
    """transport.kind inline: the draft worker in the router's process. Proposals cost no actor
    call (about 1.3 ms a round on a 2-core node); the draft's compute runs on the router's cores."""

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


def build_runtime(cfg: ServeConfig, wait_ready: bool = True) -> Runtime:
    """Start the pools on the connected Ray cluster and a router driving them."""
    from specray.cluster.pools import RayTargetPool

    checkpoint = resolve(cfg.model)  # converts a GGUF once per node; workers then find it cached
    tokenizer = checkpoint.tokenizer()
    model_config = ModelConfig.from_hf(checkpoint.hf_config())
    target = RayTargetPool(target_spec(cfg), placement(cfg.pools.target), cfg.pools.target.num_workers)
    draft = build_draft_pool(cfg)
    if wait_ready:
        for pool in (target, draft):
            if pool is not None:
                pool.ready()
    econfig, eos = engine_config(model_config, tokenizer, cfg.speculative, cfg.router.max_model_len,
                                 cfg.router.max_num_seqs, num_blocks(cfg), cfg.router.block_size,
                                 cfg.pipelined)
    engine = Engine(target, draft, tokenizer, eos, econfig)
    return Runtime(cfg, engine, AsyncEngine(engine, cfg.router.max_waiting), tokenizer, target, draft)
