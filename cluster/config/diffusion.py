"""User-facing options of a diffusion LM: how it decodes, and FreeDave as its speculative method.

`speculative_config={"method": "freedave", "num_drafts": K}` turns FreeDave on (K drafts a call;
1 is static decoding); the drafts come from the model itself, so nothing else of an autoregressive
speculative_config applies and naming it is an error. `diffusion_config={"block_length": B,
"steps_per_block": S}` sets the static decoding every method must reproduce.
"""

from __future__ import annotations

from typing import Any

from specray.kernels.diffusion.decoding import DecodeOptions

FREEDAVE = "freedave"
DEFAULT_NUM_DRAFTS = 4  # when speculative_config names freedave without num_drafts
DIFFUSION_KEYS = ("block_length", "steps_per_block")


def decode_options(speculative_config: dict[str, Any] | None,
                   diffusion_config: dict[str, Any] | None) -> DecodeOptions:
    """-> DecodeOptions; ValueError for anything a diffusion LM cannot do, saying why."""
    diffusion = dict(diffusion_config or {})
    unknown = sorted(set(diffusion) - set(DIFFUSION_KEYS))
    if unknown:
        raise ValueError(f"unknown diffusion_config keys {unknown}; known keys: {list(DIFFUSION_KEYS)}")
    return DecodeOptions(**diffusion, num_drafts=num_drafts(speculative_config))


def num_drafts(speculative_config: dict[str, Any] | None) -> int:
    spec = dict(speculative_config or {})
    if not spec:
        return 1
    method = spec.pop("method", FREEDAVE)
    if method != FREEDAVE:
        raise ValueError(f"a diffusion LM speculates with method 'freedave' only (its drafts come from the model "
                         f"itself), got method {method!r}")
    if spec.get("model") is not None:
        raise ValueError("a diffusion LM takes no draft model: FreeDave drafts from the model itself; "
                         "drop speculative_config['model']")
    drafts = spec.pop("num_drafts", DEFAULT_NUM_DRAFTS)
    if spec:
        raise ValueError(f"speculative_config keys {sorted(spec)} do not apply to a diffusion LM; "
                         "FreeDave takes 'method' and 'num_drafts'")
    if not isinstance(drafts, int) or isinstance(drafts, bool) or drafts < 1:
        raise ValueError(f"num_drafts (FreeDave's K) must be an integer >= 1, got {drafts!r}")
    return drafts
