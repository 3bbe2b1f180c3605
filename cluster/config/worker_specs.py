"""The one translation of the user-facing configs into what workers build themselves from."""

from __future__ import annotations

from specray.actors.specs import DraftSpec, TargetSpec
from specray.cluster.config.serve import ServeConfig
from specray.cluster.config.speculative import SpeculativeConfig
from specray.kernels.ints import ceil_div


def num_blocks(kv_cache_tokens: int, block_size: int) -> int:
    """KV blocks that hold `kv_cache_tokens` tokens (the target's, and each drafter's)."""
    return ceil_div(kv_cache_tokens, block_size)


def draft_spec(spec: SpeculativeConfig | None, target: str, dtype: str, device: str, kv_cache_tokens: int,
               block_size: int, threads: int | None = None) -> DraftSpec | None:
    """The draft worker's spec for `speculative_config`; None without speculation."""
    if spec is None:
        return None
    model = spec.model or (target if spec.method == "aded" else None)  # aded tokenizes with the target's
    return DraftSpec(spec.method, model, spec.draft_num_layers, spec.prompt_lookup_min, spec.prompt_lookup_max,
                     dtype, device, num_blocks(kv_cache_tokens, block_size), block_size, tree=spec.tree,
                     aded=spec.aded, longspec=spec.longspec, draft_vocab_trim=spec.draft_vocab_trim,
                     draft_quantization=spec.draft_quantization, lookup_first=spec.lookup_first,
                     layer_parallel=spec.layer_parallel, threads=threads)


def serve_draft_spec(cfg: ServeConfig) -> DraftSpec | None:
    p = cfg.pools.draft
    return draft_spec(cfg.speculative, cfg.model, p.dtype, p.device, cfg.router.kv_cache_tokens,
                      cfg.router.block_size, p.threads)


def serve_target_spec(cfg: ServeConfig) -> TargetSpec:
    p, r = cfg.pools.target, cfg.router
    return TargetSpec(cfg.model, p.dtype, p.device, num_blocks(r.kv_cache_tokens, r.block_size), r.block_size,
                      p.threads, kernels=p.kernels)
