"""What a target speculates with when the user does not say (serve config, `specray generate`)."""

from __future__ import annotations

from typing import Any

from specray.kernels.drafters import registry
from specray.kernels.loader import DEFAULT_DRAFTS, TARGET_DRAFTS

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024  # HTTP body / gRPC message: far above a full context of token ids

# With a packaged trained draft: prompt lookup first (up to 4 tokens where the last tokens occurred
# before), else one draft-model token; each round's length adapts to the sequence's acceptance and
# this machine's measured step costs (cluster/router/adaptive.py), so a machine where verified rows
# are dear drafts less and one where they are cheap drafts more; off once two sequences run (batches
# of 2+ gained nothing from it on CPU). The paired runs behind this are in docs/performance.md
# ("Figures behind choices in the code").
DEFAULT_DRAFT_TOKENS = 4
DEFAULT_LOOKUP_FIRST = {"model_tokens": 1}
DEFAULT_DISABLE_BY_BATCH_SIZE = 2


def default_speculative_config(model: str) -> dict[str, Any]:
    """The target's packaged trained draft (`specray distill`; smollm2-135m -> smollm2-135m-eagle),
    FreeDave for a diffusion LM, else n-gram prompt lookup."""
    from specray.kernels.loader import is_diffusion_model

    if is_diffusion_model(model):
        from specray.cluster.config.diffusion import DEFAULT_NUM_DRAFTS, FREEDAVE

        return {"method": FREEDAVE, "num_drafts": DEFAULT_NUM_DRAFTS}
    if model in DEFAULT_DRAFTS:
        from specray.kernels.drafters.eagle import is_eagle_folder
        from specray.kernels.loader import resolve

        draft = DEFAULT_DRAFTS[model]
        return {"method": "eagle" if is_eagle_folder(resolve(draft).path) else "draft_model", "model": draft,
                "num_speculative_tokens": DEFAULT_DRAFT_TOKENS, "lookup_first": dict(DEFAULT_LOOKUP_FIRST),
                "disable_by_batch_size": DEFAULT_DISABLE_BY_BATCH_SIZE, "adaptive": True}
    return {"method": "ngram", "num_speculative_tokens": 2}


def draft_method(folder) -> str:
    """The method a draft folder serves: eagle (eagle.json), longspec (longspec.json), else draft_model."""
    from specray.kernels.drafters.eagle import is_eagle_folder
    from specray.kernels.drafters.longspec_folder import is_longspec_folder

    return "eagle" if is_eagle_folder(folder) else "longspec" if is_longspec_folder(folder) else "draft_model"


def packaged_draft(model: str, method: str) -> str | None:
    """The target's packaged draft that `method` serves (eagle: a feature-level folder, longspec: a
    LongSpec folder, draft_model: a standalone model), or None: `--speculative-method draft_model`
    alone must not pick the eagle one."""
    from specray.kernels.loader import resolve

    entry = registry.METHODS.get(method)
    if entry is None or not entry.needs_model:
        return None
    for draft in TARGET_DRAFTS.get(model, ()):
        if draft_method(resolve(draft).path) == method:
            return draft
    return None


def is_default_for_other(model: str) -> list[dict[str, Any]]:
    """The default speculative configs of the other targets with packaged drafts (and, for a
    diffusion LM, the autoregressive default too: none of them applies to it)."""
    others = [default_speculative_config(m) for m in DEFAULT_DRAFTS if m != model]
    from specray.kernels.loader import is_diffusion_model

    return others + [{"method": "ngram", "num_speculative_tokens": 2}] if is_diffusion_model(model) else others
