"""Turn a ServeConfig into a running router: Ray pools (or an external gRPC drafter), the router
and its asyncio driver. Used by the Serve deployment, and by tests and benchmarks directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specray.cluster.config.defaults import resolve_prefill_tokens
from specray.cluster.config.serve import ServeConfig
from specray.cluster.config.worker_specs import num_blocks
from specray.cluster.pools import compute_thread
from specray.cluster.pools.build import build_draft_pool, build_target_pool
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.router.limits import router_limits
from specray.cluster.router.router import Router
from specray.kernels.config import ModelConfig
from specray.kernels.loader import resolve


@dataclass
class Runtime:
    config: ServeConfig
    router: Router
    async_router: AsyncRouter
    tokenizer: object
    target_pool: object
    draft_pool: object | None
    sampling_defaults: dict = field(default_factory=dict)  # the model's, for options a request leaves unset

    @property
    def api_key(self) -> str | None:
        return self.config.http.resolved_api_key()

    def shutdown(self) -> None:
        self.async_router.shutdown()
        for pool in (self.draft_pool, self.target_pool):
            if hasattr(pool, "close"):
                pool.close()


def alive_nodes() -> int:
    """Nodes of the connected Ray cluster; 1 where Ray is not running (the workers run here anyway)."""
    import ray

    if not ray.is_initialized():
        return 1
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def resolve_colocation(cfg: ServeConfig) -> ServeConfig:
    """`pools.colocate: auto` decided on the connected cluster, before the replica is sized for it."""
    if cfg.pools.colocate != "auto":
        return cfg
    return cfg.with_overrides(**{"pools.colocate": cfg.pools.colocated(alive_nodes())})


def runtime_sampling_defaults(cfg: ServeConfig, model_folder: Path) -> dict:
    """The model's sampling defaults (cluster/generation_defaults.py); a diffusion LM takes none."""
    from specray.cluster.generation_defaults import sampling_defaults

    return sampling_defaults(cfg.generation_config, model_folder, cfg.diffusion)


def build_runtime(cfg: ServeConfig, wait_ready: bool = True) -> Runtime:
    """Start the pools on the connected Ray cluster and a router driving them."""
    checkpoint = resolve(cfg.model)  # converts a GGUF once per node; workers then find it cached
    tokenizer = checkpoint.tokenizer()
    if cfg.diffusion:
        return build_diffusion_runtime(cfg, checkpoint, tokenizer, wait_ready)
    model_config = ModelConfig.from_hf(checkpoint.hf_config())
    colocated = resolve_colocation(cfg).pools.colocate
    target = build_target_pool(cfg, colocated)
    draft = build_draft_pool(cfg, colocated)
    if wait_ready:
        for pool in (target, draft):
            if pool is not None:
                pool.ready()
    r = cfg.router
    limits, eos = router_limits(model_config, tokenizer, cfg.speculative, r.max_model_len, r.max_num_seqs,
                                num_blocks(r.kv_cache_tokens, r.block_size), r.block_size, cfg.pipelined,
                                resolve_prefill_tokens(r.max_prefill_tokens, cfg.pools.target.device),
                                r.enable_prefix_caching)
    router = Router(target, draft, tokenizer, eos, limits)
    rounds = AsyncRouter(router, cfg.router.max_waiting, compute_thread.post, compute_thread.waiting)
    return Runtime(cfg, router, rounds, tokenizer, target, draft, runtime_sampling_defaults(cfg, checkpoint.path))


def build_diffusion_runtime(cfg: ServeConfig, checkpoint, tokenizer, wait_ready: bool = True) -> Runtime:
    """A diffusion LM: one worker (a Ray actor, or in this process with pools.colocate) and the
    DiffusionRouter; no draft pool (FreeDave drafts from the model itself)."""
    from specray.actors.diffusion_worker import DiffusionWorker
    from specray.actors.specs import DiffusionSpec
    from specray.cluster.pools.build import placement
    from specray.cluster.pools.in_process import InProcessDiffusionPool
    from specray.cluster.pools.ray_diffusion import RayDiffusionPool
    from specray.cluster.router.diffusion_router import DiffusionRouter, diffusion_limits
    from specray.kernels.diffusion.weights import read_config

    options, p, r = cfg.decode_options(), cfg.pools.target, cfg.router
    spec = DiffusionSpec(cfg.model, p.dtype, p.device, options.block_length, options.steps_per_block,
                         options.num_drafts, p.threads, options.adaptive)
    config = read_config(checkpoint.path)
    limits = diffusion_limits(config, options.block_length, r.max_model_len, r.max_num_seqs)  # before any worker
    colocated = resolve_colocation(cfg).pools.colocate
    pool = InProcessDiffusionPool(compute_thread.OnComputeThread(DiffusionWorker.from_spec, spec)) if colocated \
        else RayDiffusionPool(spec, placement(p), timeout_s=r.target_timeout_s)
    if wait_ready:
        pool.ready()
    eos = set(config.model.eos_token_ids) or {tokenizer.eos_token_id}
    router = DiffusionRouter(pool, tokenizer, eos, limits)
    rounds = AsyncRouter(router, r.max_waiting, compute_thread.post, compute_thread.waiting)
    return Runtime(cfg, router, rounds, tokenizer, pool, None)
