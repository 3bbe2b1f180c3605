"""What a target speculates with when the user does not say (serve config, `specray generate`)."""

from __future__ import annotations

from typing import Any

from specray.kernels.loader import DEFAULT_DRAFTS

# With a packaged trained draft: one draft token a round, and none once two sequences run. Paired,
# interleaved runs on a 2-core CPU (docs/bench_default_draft_cpu.json) put smollm2-135m-eagle at
# k=1 level with plain decoding at batch 1 (0.98-1.0x; k=2 0.89x, k=3 0.77x: each extra verified row
# costs ~1.3x a decode step there) and at 0.81x at batch 4; the default n-gram at 0.96x and 0.72x.
# On accelerators, where verifying a few rows costs about one, ask for more (num_speculative_tokens 3-4).
DEFAULT_DRAFT_TOKENS = 1
DEFAULT_DISABLE_BY_BATCH_SIZE = 2


def default_speculative_config(model: str) -> dict[str, Any]:
    """The target's packaged trained draft (`specray distill`; smollm2-135m -> smollm2-135m-eagle),
    else n-gram prompt lookup."""
    if model in DEFAULT_DRAFTS:
        from specray.kernels.drafters.eagle import is_eagle_folder
        from specray.kernels.loader import resolve

        draft = DEFAULT_DRAFTS[model]
        return {"method": "eagle" if is_eagle_folder(resolve(draft).path) else "draft_model", "model": draft,
                "num_speculative_tokens": DEFAULT_DRAFT_TOKENS, "disable_by_batch_size": DEFAULT_DISABLE_BY_BATCH_SIZE}
    return {"method": "ngram", "num_speculative_tokens": 2}


def is_default_for_other(model: str) -> list[dict[str, Any]]:
    """The default speculative configs of the other targets with packaged drafts."""
    return [default_speculative_config(m) for m in DEFAULT_DRAFTS if m != model]
