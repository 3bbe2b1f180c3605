"""What a target speculates with when the user does not say (serve config, `specray generate`)."""

from __future__ import annotations

from typing import Any

from specray.kernels.drafters import registry
from specray.kernels.loader import DEFAULT_DRAFTS, TARGET_DRAFTS

DEFAULT_BODY_TIMEOUT_S = 60.0  # a request body must arrive whole within this of its head (8 MiB at ~1 Mbit/s)
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024  # HTTP body / gRPC message: far above a full context of token ids

# A round's prompt tokens (chunked prefill; `max_prefill_tokens: auto`). On a CPU a round's time
# grows with its prompt tokens, and every running sequence waits for it: served Spec-Bench at 8
# concurrent requests, 256 kept 512's tokens/s with a lower TTFT p50 and an ITL p99 of 0.5 s
# against 0.85. Beside decoding sequences a round prefills at most 64 of them: their ITL p99 fell
# about threefold for the same tokens/s; a round with nobody decoding has no gap to protect and
# keeps 256 (docs/performance.md, Zen 4, 2026-11-28). An accelerator's step costs about the same up to hundreds of
# rows, so it keeps fewer, larger chunks (not measured there).
CPU_PREFILL_TOKENS = 256
CPU_DECODING_PREFILL_TOKENS = 64
ACCELERATOR_PREFILL_TOKENS = 512

# Every device: prompt lookup (n-gram) of a match of at least 2 tokens (a lone token's match
# proposes mostly misses, which teach the length policy to stop drafting), its length adaptive up to
# 4 tokens (each round, each sequence drafts what maximises expected tokens per cost, from its
# acceptance and this machine's measured step costs: cluster/router/adaptive.py), off once two
# sequences run (batches of 2+ gained nothing from drafting). Paired Spec-Bench runs put it ahead of
# the packaged trained draft (behind lookup or alone) on CPU, where that draft costs a fifth of a
# step a token and verified rows are dear, and on an H100, where a step is bound by launches and
# the draft's launches cost a large share of it (docs/performance.md, "Figures behind choices in
# the code"); `trained_draft_config` is what `--speculative-method eagle` gets.
DEFAULT_DRAFT_TOKENS = 4
DEFAULT_LOOKUP_MIN = 2
DEFAULT_LOOKUP_FIRST = {"model_tokens": 1}
DEFAULT_DISABLE_BY_BATCH_SIZE = 2


def default_speculative_config(model: str, device: str = "cpu") -> dict[str, Any]:
    """FreeDave for a diffusion LM; else adaptive n-gram, on every `device` (measured the best on
    CPU and on an H100; the argument stays for devices where that changes)."""
    from specray.kernels.loader import is_diffusion_model

    if is_diffusion_model(model):
        from specray.cluster.config.diffusion import DEFAULT_NUM_DRAFTS, FREEDAVE

        return {"method": FREEDAVE, "num_drafts": DEFAULT_NUM_DRAFTS}
    return adaptive_ngram_config()


def default_prefill_tokens(device: str) -> int:
    """`max_prefill_tokens: auto` on `device` ("cpu", "cpu:0", "cuda", "cuda:1", ...)."""
    return CPU_PREFILL_TOKENS if str(device).split(":")[0] == "cpu" else ACCELERATOR_PREFILL_TOKENS


def resolve_prefill_tokens(value: int | str | None, device: str) -> tuple[int | None, int | None]:
    """A max_prefill_tokens setting as the router takes it: (a round's prompt tokens at most, the
    same beside decoding sequences, None: as many). "auto" -> this device's defaults; a number or
    None holds for every round; anything else is a ValueError."""
    if value != "auto":
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"max_prefill_tokens must be a positive integer, 'auto' or None, got {value!r}")
        return value, None
    cpu = str(device).split(":")[0] == "cpu"
    return default_prefill_tokens(device), CPU_DECODING_PREFILL_TOKENS if cpu else None


def adaptive_ngram_config() -> dict[str, Any]:
    """Prompt lookup of up to DEFAULT_DRAFT_TOKENS after a match of DEFAULT_LOOKUP_MIN or more,
    adaptive, off from two running sequences."""
    return {"method": "ngram", "num_speculative_tokens": DEFAULT_DRAFT_TOKENS,
            "prompt_lookup_min": DEFAULT_LOOKUP_MIN, "disable_by_batch_size": DEFAULT_DISABLE_BY_BATCH_SIZE,
            "adaptive": True}


def trained_draft_config(model: str) -> dict[str, Any] | None:
    """The target's packaged trained draft (`specray distill`; smollm2-135m -> smollm2-135m-eagle)
    behind prompt lookup, adaptive, off from two sequences; None without one."""
    if model not in DEFAULT_DRAFTS:
        return None
    from specray.kernels.drafters.eagle import is_eagle_folder
    from specray.kernels.loader import resolve

    draft = DEFAULT_DRAFTS[model]
    return {"method": "eagle" if is_eagle_folder(resolve(draft).path) else "draft_model", "model": draft,
            "num_speculative_tokens": DEFAULT_DRAFT_TOKENS, "lookup_first": dict(DEFAULT_LOOKUP_FIRST),
            "disable_by_batch_size": DEFAULT_DISABLE_BY_BATCH_SIZE, "adaptive": True}


def method_recipe(model: str, method: str, default: dict[str, Any]) -> dict[str, Any] | None:
    """The tuned extras for `method` on `model`: the default's where it is that method, else the
    packaged trained draft's recipe (asking for eagle gets it behind prompt lookup), else None."""
    if method == default.get("method"):
        return default
    trained = trained_draft_config(model)
    return trained if trained is not None and trained["method"] == method else None


def packaged_draft(model: str, method: str) -> str | None:
    """The target's packaged draft that `method` serves (eagle: a feature-level folder, longspec: a
    LongSpec folder, draft_model: a standalone model), or None: `--speculative-method draft_model`
    alone must not pick the eagle one."""
    from specray.kernels.drafters.loading import draft_method
    from specray.kernels.loader import resolve

    entry = registry.METHODS.get(method)
    if entry is None or not entry.needs_model:
        return None
    for draft in TARGET_DRAFTS.get(model, ()):
        if draft_method(resolve(draft).path) == method:
            return draft
    return None


def is_default_for_other(model: str, device: str = "cpu") -> list[dict[str, Any]]:
    """The default speculative configs of the other targets with packaged drafts (and, for a
    diffusion LM, the autoregressive defaults too: none of them applies to it)."""
    others = [default_speculative_config(m, device) for m in DEFAULT_DRAFTS if m != model]
    from specray.kernels.loader import is_diffusion_model

    if not is_diffusion_model(model):
        return others
    return others + [adaptive_ngram_config()]
