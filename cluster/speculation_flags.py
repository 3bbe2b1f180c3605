"""The speculation flags `specray generate` and `specray serve` share: what a draft model names, and
the refusals of flags beside `--speculative-method none` or a whole `--speculative-config`; serve's
speculative_config from its flags over its config file's."""

from __future__ import annotations

from specray.cluster.config.speculative import method_of_draft
from specray.kernels.drafters.registry import METHODS


def speculative_override(args, current: dict | None, target: str):
    """`specray serve`'s speculative_config from its flags over the config's (`current`), or False when
    they ask for nothing."""
    from specray.cluster.config.defaults import packaged_draft, trained_draft_config

    if args.speculative_config is not None:
        refuse_beside_speculative_config(args, SERVE_SPEC_FLAGS)
        return args.speculative_config
    if args.speculative_method == "none":
        refuse_beside_none(args, SERVE_SPEC_FLAGS)
        return None
    adaptive = getattr(args, "adaptive_speculation", None)
    if (args.speculative_method is None and args.draft_model is None and args.num_speculative_tokens is None
            and not args.lookup_first and adaptive is None):
        return False
    spec = dict(current or {})
    if args.draft_model and args.speculative_method and not uses_draft_model(args.speculative_method):
        raise ValueError(f"--draft-model needs a method that runs a draft model; --speculative-method "
                         f"{args.speculative_method} runs none (leave one of the two out)")
    # a draft model alone names its method (as vLLM infers it): the default's extras go as for --speculative-method
    method = args.speculative_method or (method_of_draft(args.draft_model) if args.draft_model else None)
    if method:
        if method != spec.get("method"):
            trained = trained_draft_config(target)
            if (trained is not None and trained["method"] == method
                    and args.draft_model in (None, trained["model"])):
                spec = dict(trained)  # the packaged trained draft's tuned extras (eagle on CPU)
            else:
                # another method keeps the length, not the default's extras (an adaptive default's
                # length is a cap: a fixed chain starts from 2)
                k = 2 if spec.get("adaptive") else spec.get("num_speculative_tokens")
                spec = {} if k is None else {"num_speculative_tokens": k}
        spec["method"] = method
    if args.draft_model:
        spec["model"] = args.draft_model
    draft = packaged_draft(target, spec.get("method", ""))
    if draft and not spec.get("model"):  # e.g. --speculative-method draft_model alone
        spec["model"] = draft
    if args.num_speculative_tokens is not None:
        spec["num_speculative_tokens"] = args.num_speculative_tokens
    if args.lookup_first:  # a recipe's own lookup-first settings (eagle's model_tokens) stay
        spec["lookup_first"] = spec.get("lookup_first") or True
    if adaptive is not None:
        spec["adaptive"] = adaptive == "on"
    if spec.get("method") != "ngram":  # the flags moved off prompt lookup: its keys go with it
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            spec.pop(key, None)
    return spec


def uses_draft_model(method: str | None) -> bool:
    entry = METHODS.get(method or "")
    return entry is not None and entry.needs_model


SERVE_SPEC_FLAGS = ("speculative_method", "draft_model", "num_speculative_tokens", "lookup_first",
                    "adaptive_speculation")


def refuse_beside_none(args, flags: tuple[str, ...]) -> None:
    """--speculative-method none turns speculation off: another speculation flag beside it is a mistake."""
    given = [f"--{f.replace('_', '-')}" for f in flags
             if f != "speculative_method" and getattr(args, f, None) not in (None, False)]
    if given:
        raise ValueError(f"--speculative-method none turns speculation off; drop {', '.join(given)}")


def refuse_beside_speculative_config(args, flags: tuple[str, ...]) -> None:
    """--speculative-config is the whole config: a flag beside it would be ambiguous (which wins?)."""
    given = [f"--{f.replace('_', '-')}" for f in flags if getattr(args, f, None) not in (None, False)]
    if given:
        raise ValueError(f"--speculative-config is the whole speculative_config; put {', '.join(given)} "
                         "inside it instead")

