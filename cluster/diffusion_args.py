"""Command-line flags of diffusion LMs (generate, serve, bench): FreeDave's drafts and the blocks."""

from __future__ import annotations

import argparse

from specray.cluster.config.diffusion import DEFAULT_NUM_DRAFTS, FREEDAVE
from specray.kernels.loader import is_diffusion_model

# speculation flags that belong to autoregressive models: an error beside a diffusion LM
AR_FLAGS = ("draft_model", "num_speculative_tokens", "draft_vocab_trim", "draft_num_layers", "draft_quantization",
            "lookup_first", "disable_by_batch_size", "adaptive_speculation", "prompt_lookup_min", "prompt_lookup_max")


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
        raise ValueError(f"only diffusion LMs take {', '.join(named) or '--speculative-method freedave'}; "
                         f"{model!r} is autoregressive")


def _num_drafts(args, given: dict, current: int | None = None) -> int:
    """FreeDave's drafts from the flags: `none` is static decoding (one draft), whatever else is set."""
    n = given["num_drafts"]
    if n is not None and n < 1:
        raise ValueError(f"--num-drafts must be an integer >= 1 (1 = static decoding), got {n}")
    if getattr(args, "speculative_method", None) == "none":
        if n not in (None, 1) or getattr(args, "adaptive", None) is not None:
            raise ValueError("--speculative-method none is static decoding (one draft): drop --num-drafts "
                             "and --fixed-drafts, or use --speculative-method freedave")
        return 1
    return n or current or DEFAULT_NUM_DRAFTS


def diffusion_configs(args) -> tuple[dict | None, dict] | None:
    """(speculative_config, diffusion_config) for a diffusion model; None for an autoregressive one
    (then the diffusion flags are an error). `--speculative-config` is FreeDave's whole config, as
    `specray serve` takes it (checked where the model loads)."""
    given = _given(args)
    if not is_diffusion_model(args.model):
        _refuse_for_autoregressive(args, args.model, given)
        return None
    spec = _whole_spec(args, given)
    diffusion = _block_options(given)
    return (spec if spec is not None else _freedave(_num_drafts(args, given), args)), diffusion


def _whole_spec(args, given: dict) -> dict | None:
    """A diffusion LM's flags checked: an autoregressive model's speculation flags and a method but
    FreeDave are errors, as is --speculative-config (FreeDave's whole config) beside the flags it
    holds. -> that --speculative-config, or None."""
    wrong = [f"--{k.replace('_', '-')}" for k in AR_FLAGS if getattr(args, k, None) not in (None, False)]
    if wrong:
        raise ValueError(f"a diffusion LM takes none of {', '.join(wrong)} (FreeDave drafts from the model itself): "
                         "use --num-drafts")
    method = getattr(args, "speculative_method", None)
    if method not in (None, FREEDAVE, "none"):
        raise ValueError(f"a diffusion LM speculates with freedave only, got --speculative-method {method}")
    spec = getattr(args, "speculative_config", None)
    if spec is not None and (method is not None or given["num_drafts"] is not None
                             or getattr(args, "adaptive", None) is not None):
        raise ValueError("--speculative-config is the whole speculative_config: put num_drafts and adaptive "
                         "inside it, without --speculative-method, --num-drafts or --fixed-drafts")
    return spec


def _block_options(given: dict) -> dict:
    """The diffusion_config the block flags ask for (block_length, steps_per_block)."""
    return {k: v for k, v in given.items() if k != "num_drafts" and v is not None}


def _freedave(drafts: int, args) -> dict:
    spec = {"method": FREEDAVE, "num_drafts": drafts}
    if getattr(args, "adaptive", None) is not None:
        spec["adaptive"] = args.adaptive
    return spec


def serve_overrides(args, model: str, current: dict | None, current_diffusion: dict | None = None) -> dict:
    """ServeConfig overrides of the diffusion flags (`specray serve`), each over the config's own
    (`current`, `current_diffusion`: a flag changes its key, the file keeps the rest); {} when none
    was given."""
    given, method = _given(args), getattr(args, "speculative_method", None)
    diffusion_model = is_diffusion_model(model)
    autoregressive_flags = any(getattr(args, k, None) not in (None, False) for k in AR_FLAGS)
    if all(v is None for v in given.values()) and method != FREEDAVE and getattr(args, "adaptive", None) is None \
            and not (method == "none" and diffusion_model) and not (autoregressive_flags and diffusion_model):
        return {}
    if not diffusion_model:
        _refuse_for_autoregressive(args, model, given)
    spec = _whole_spec(args, given)
    if spec is None:
        # the file's FreeDave (or its static decoding, None); an autoregressive model's default is not one
        base = current if current is None or current.get("method") == FREEDAVE else \
            {"method": FREEDAVE, "num_drafts": DEFAULT_NUM_DRAFTS}
        spec = _over(base, args, given)
    diffusion = {**(current_diffusion or {}), **_block_options(given)}
    return {"speculative_config": spec, "diffusion_config": diffusion or None}


def _over(base: dict | None, args, given: dict) -> dict | None:
    """FreeDave's config with the flags' drafts over `base`; `base` itself when they name none."""
    method = getattr(args, "speculative_method", None)
    if method == "none":
        return _freedave(_num_drafts(args, given), args)
    if given["num_drafts"] is None and getattr(args, "adaptive", None) is None and method is None:
        return base
    spec = dict(base or {"method": FREEDAVE})
    spec["num_drafts"] = _num_drafts(args, given, spec.get("num_drafts"))
    if getattr(args, "adaptive", None) is not None:
        spec["adaptive"] = args.adaptive
    return spec
