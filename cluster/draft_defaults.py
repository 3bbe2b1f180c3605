"""What a target speculates with when the user does not say (serve config, `specray generate`)."""

from __future__ import annotations

from typing import Any

from specray.kernels.loader import DEFAULT_DRAFTS

DEFAULT_DRAFT_TOKENS = 3  # num_speculative_tokens with a packaged trained draft (measured: cluster/data/drafts/README.md)


def default_speculative_config(model: str) -> dict[str, Any]:
    """The target's packaged trained draft (`specray distill`; smollm2-135m -> smollm2-135m-draft),
    else n-gram prompt lookup."""
    if model in DEFAULT_DRAFTS:
        return {"method": "draft_model", "model": DEFAULT_DRAFTS[model], "num_speculative_tokens": DEFAULT_DRAFT_TOKENS}
    return {"method": "ngram", "num_speculative_tokens": 2}


def is_default_for_other(model: str) -> list[dict[str, Any]]:
    """The default speculative configs of the other targets with packaged drafts."""
    return [default_speculative_config(m) for m in DEFAULT_DRAFTS if m != model]
