"""User-facing options of a diffusion LM: how it decodes, and FreeDave as its speculative method.

`speculative_config={"method": "freedave", "num_drafts": K, "adaptive": A}` turns FreeDave on (at
most K drafts a call; 1 is static decoding; with A, each sequence's drafts a round are the number
that maximises expected steps per second, kernels/diffusion/budget.py); the drafts come from the
model itself, so nothing else of an autoregressive speculative_config applies and naming it is an
error. `diffusion_config={"block_length": B,
"steps_per_block": S}` sets the static decoding every method must reproduce.
"""

from __future__ import annotations

from typing import Any

from specray.kernels.diffusion.decoding import DecodeOptions

FREEDAVE = "freedave"
DEFAULT_NUM_DRAFTS = 4  # when speculative_config names freedave without num_drafts
DEFAULT_ADAPTIVE = True  # ... or without adaptive
DIFFUSION_KEYS = ("block_length", "steps_per_block")


def decode_options(speculative_config: dict[str, Any] | None,
                   diffusion_config: dict[str, Any] | None) -> DecodeOptions:
    """-> DecodeOptions; ValueError for anything a diffusion LM cannot do, saying why."""
    diffusion = dict(diffusion_config or {})
    unknown = sorted(set(diffusion) - set(DIFFUSION_KEYS))
    if unknown:
        raise ValueError(f"unknown diffusion_config keys {unknown}; known keys: {list(DIFFUSION_KEYS)}")
    drafts, adaptive = freedave_options(speculative_config)
    return DecodeOptions(**diffusion, num_drafts=drafts, adaptive=adaptive)


def freedave_options(speculative_config: dict[str, Any] | None) -> tuple[int, bool]:
    """-> (num_drafts, adaptive); (1, False) without speculative_config: static decoding."""
    spec = dict(speculative_config or {})
    if not spec:
        return 1, False
    method = spec.pop("method", FREEDAVE)
    if method != FREEDAVE:
        raise ValueError(f"a diffusion LM speculates with method 'freedave' only (its drafts come from the model "
                         f"itself), got method {method!r}")
    if spec.get("model") is not None:
        raise ValueError("a diffusion LM takes no draft model: FreeDave drafts from the model itself; "
                         "drop speculative_config['model']")
    drafts = spec.pop("num_drafts", DEFAULT_NUM_DRAFTS)
    adaptive = spec.pop("adaptive", DEFAULT_ADAPTIVE)
    if spec:
        raise ValueError(f"speculative_config keys {sorted(spec)} do not apply to a diffusion LM; "
                         "FreeDave takes 'method', 'num_drafts' and 'adaptive'")
    if not isinstance(drafts, int) or isinstance(drafts, bool) or drafts < 1:
        raise ValueError(f"num_drafts (FreeDave's K) must be an integer >= 1, got {drafts!r}")
    if not isinstance(adaptive, bool):
        raise ValueError(f"adaptive must be true or false, got {adaptive!r}")
    return drafts, adaptive
