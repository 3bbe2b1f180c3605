"""Command-line flags of diffusion LMs (generate, serve, bench): FreeDave's drafts and the blocks."""

from __future__ import annotations

import argparse

from specray.cluster.config.diffusion import DEFAULT_NUM_DRAFTS, FREEDAVE
from specray.kernels.loader import is_diffusion_model

# speculation flags that belong to autoregressive models: an error beside a diffusion LM
AR_FLAGS = ("draft_model", "num_speculative_tokens", "draft_vocab_trim", "draft_num_layers", "draft_quantization",
            "lookup_first", "disable_by_batch_size", "adaptive_speculation")


def add_diffusion_args(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("diffusion LMs (LLaDA or Dream folders)")
    d.add_argument("--num-drafts", type=int, default=None,
                   help=f"FreeDave's drafts a model call (default {DEFAULT_NUM_DRAFTS}; 1 = static decoding, "
                        "as does --speculative-method none)")
    d.add_argument("--fixed-drafts", dest="adaptive", action="store_false", default=None,
                   help="always --num-drafts drafts (default: each sequence's drafts a round adapt, up to it, "
                        "to what its chains reach and what a call costs)")
    d.add_argument("--block-length", type=int, default=None, help="semi-autoregressive block (default 32)")
    d.add_argument("--steps-per-block", type=int, default=None,
                   help="static steps a block (default: the block length, one token a step)")


def _given(args) -> dict:
    return {k: getattr(args, k, None) for k in ("num_drafts", "block_length", "steps_per_block")}


def _refuse_for_autoregressive(args, model: str, given: dict) -> None:
    """The diffusion flags (or --speculative-method freedave) beside an autoregressive model: an error."""
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    named += ["--fixed-drafts"] if getattr(args, "adaptive", None) is False else []
    if named or getattr(args, "speculative_method", None) == FREEDAVE:
        raise ValueError(f"{', '.join(named) or '--speculative-method freedave'} apply to diffusion LMs; "
                         f"{model!r} is autoregressive")


def diffusion_configs(args) -> tuple[dict | None, dict] | None:
    """(speculative_config, diffusion_config) for a diffusion model; None for an autoregressive one
    (then the diffusion flags are an error)."""
    given = _given(args)
    if not is_diffusion_model(args.model):
        _refuse_for_autoregressive(args, args.model, given)
        return None
    wrong = [f"--{k.replace('_', '-')}" for k in AR_FLAGS if getattr(args, k, None) not in (None, False)]
    if wrong or getattr(args, "speculative_config", None) is not None:
        raise ValueError(f"{', '.join(wrong) or '--speculative-config'} do not apply to a diffusion LM "
                         "(FreeDave drafts from the model itself): use --num-drafts")
    method = getattr(args, "speculative_method", None)
    if method not in (None, FREEDAVE, "none"):
        raise ValueError(f"a diffusion LM speculates with freedave only, got --speculative-method {method}")
    drafts = 1 if method == "none" else given["num_drafts"] or DEFAULT_NUM_DRAFTS
    diffusion = {k: v for k, v in given.items() if k != "num_drafts" and v is not None}
    return _freedave(drafts, args), diffusion


def _freedave(drafts: int, args) -> dict:
    spec = {"method": FREEDAVE, "num_drafts": drafts}
    if getattr(args, "adaptive", None) is not None:
        spec["adaptive"] = args.adaptive
    return spec


def serve_overrides(args, model: str, current: dict | None) -> dict:
    """ServeConfig overrides of the diffusion flags (`specray serve`); {} when none was given."""
    given = _given(args)
    if all(v is None for v in given.values()) and getattr(args, "speculative_method", None) != FREEDAVE \
            and getattr(args, "adaptive", None) is None:
        return {}
    if not is_diffusion_model(model):
        _refuse_for_autoregressive(args, model, given)
    drafts = given["num_drafts"] or (current or {}).get("num_drafts") or DEFAULT_NUM_DRAFTS
    diffusion = {k: v for k, v in given.items() if k != "num_drafts" and v is not None}
    return {"speculative_config": _freedave(drafts, args), "diffusion_config": diffusion or None}
