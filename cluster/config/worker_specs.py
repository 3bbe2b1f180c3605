"""The one translation of the user-facing configs into what workers build themselves from."""

from __future__ import annotations

from specray.actors.specs import DraftSpec, TargetSpec
from specray.cluster.config.serve import ServeConfig
from specray.cluster.config.speculative import SpeculativeConfig
from specray.kernels.ints import ceil_div


def num_blocks(kv_cache_tokens: int, block_size: int) -> int:
    """KV blocks that hold `kv_cache_tokens` tokens (the target's, and each drafter's)."""
    return ceil_div(kv_cache_tokens, block_size)


def draft_blocks(spec: SpeculativeConfig, kv_cache_tokens: int, block_size: int, max_num_seqs: int) -> int:
    """The draft's KV blocks: the target's, and a round's scratch for every running sequence (a tree
    grown whole before its cut to the budget outgrew the target's reservation near a full cache, and
    its rounds fell back to target-only)."""
    scratch = ceil_div(spec.draft_scratch_tokens(), block_size) + 1  # + the block a sequence's tail shares
    return num_blocks(kv_cache_tokens, block_size) + max_num_seqs * scratch


def draft_spec(spec: SpeculativeConfig | None, target: str, dtype: str, device: str, kv_cache_tokens: int,
               block_size: int, threads: int | None = None, max_num_seqs: int = 32) -> DraftSpec | None:
    """The draft worker's spec for `speculative_config`; None without speculation. `max_num_seqs`:
    the router's running sequences at most (an external drafter serves the default's)."""
    if spec is None:
        return None
    model = spec.model or (target if spec.method == "aded" else None)  # aded tokenizes with the target's
    return DraftSpec(spec.method, model, spec.draft_num_layers, spec.prompt_lookup_min, spec.prompt_lookup_max,
                     dtype, device, draft_blocks(spec, kv_cache_tokens, block_size, max_num_seqs), block_size,
                     tree=spec.tree,
                     aded=spec.aded, longspec=spec.longspec, draft_vocab_trim=spec.draft_vocab_trim,
                     draft_quantization=spec.draft_quantization, lookup_first=spec.lookup_first,
                     layer_parallel=spec.layer_parallel, threads=threads)


def serve_draft_spec(cfg: ServeConfig) -> DraftSpec | None:
    p = cfg.pools.draft
    return draft_spec(cfg.speculative, cfg.model, p.dtype, p.device, cfg.router.kv_cache_tokens,
                      cfg.router.block_size, p.threads, cfg.router.max_num_seqs)


def serve_target_spec(cfg: ServeConfig) -> TargetSpec:
    p, r = cfg.pools.target, cfg.router
    return TargetSpec(cfg.model, p.dtype, p.device, num_blocks(r.kv_cache_tokens, r.block_size), r.block_size,
                      p.threads, kernels=p.kernels, enable_prefix_caching=r.enable_prefix_caching)
