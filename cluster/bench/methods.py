"""The methods `specray bench offline` knows: their names, their speculative configs and which
cells a method skips."""

from __future__ import annotations

HF_METHODS = ("hf", "hf_prompt_lookup", "hf_assisted")
# Trees and multi-draft (issue: tree speculation), drafted by the eagle draft where there is one.
TREE_METHODS = ("specray_rsd_c", "specray_rsd_s", "specray_spectr", "specray_topk", "specray_aded")
# LongSpec's draft (chains and top-k trees) and a top-k tree from the standalone draft, for the
# long-context table (chains and trees of every draft).
LONGSPEC_METHODS = ("specray_longspec", "specray_longspec_topk")
# specray_default: what `specray serve` speculates with for the model (cluster/config/defaults.py),
# on the exact kernels (+ a KERNEL_SUFFIXES suffix: another kernel mode; a GGUF on a CPU serves in fast16)
SPECRAY_METHODS = ("specray", "specray_default", "specray_ngram", "specray_draft", "specray_easyspec", "specray_eagle",
                   "specray_ngram_padded", "specray_draft_padded") + TREE_METHODS + ("specray_draft_topk",) + LONGSPEC_METHODS
METHODS = HF_METHODS + SPECRAY_METHODS
KERNEL_SUFFIXES = {"_fast16": "fast16", "_fast": "fast"}  # a specray method + suffix: its engine in that kernel mode
# by default also plain decoding and the default speculation in fast16: what `specray serve` runs a GGUF
# in on a CPU (skipped where the model has no GGUF blocks, whose fast16 would be exact)
SERVED_MODE_METHODS = ("specray_fast16", "specray_default_fast16")


def kernel_suffix(method: str) -> str:
    """The method's KERNEL_SUFFIXES suffix, or ""."""
    return next((s for s in KERNEL_SUFFIXES if method.endswith(s)), "")


def kernels_of(method: str) -> str:
    """The kernel mode a method's engine runs: its suffix's, else exact."""
    return KERNEL_SUFFIXES.get(kernel_suffix(method), "exact")


def base_method(method: str) -> str:
    suffix = kernel_suffix(method)
    return method[: -len(suffix)] if suffix else method


PADDED = "_padded"  # a method + this (before any kernel suffix): its engine on the padded baseline (EMS-SD's)


def is_padded(method: str) -> bool:
    """specray_ngram_padded and specray_ngram_padded_fast16 run the padded baseline."""
    return base_method(method).endswith(PADDED)


def engine_of(method: str) -> str:
    """The engine a method runs on: a padded method reuses its ragged twin's (specray_ngram_padded_fast:
    specray_ngram_fast's)."""
    return method.replace(PADDED, "")


def needs_padding(engine: str, methods: list[str]) -> bool:
    """Whether one of `methods` runs `engine` padded (its KV then holds every sequence padded)."""
    return any(is_padded(m) and engine_of(m) == engine for m in methods)


def known_method(method: str) -> bool:
    return method in METHODS or (kernel_suffix(method) != "" and base_method(method) in SPECRAY_METHODS)


def tree_shapes(depth: int) -> dict[str, dict]:
    """Each tree kind at `depth` with two candidates a level: RSD-C branches twice at the first two
    depths and then chains; RSD-S keeps a beam of 2, SpecTr draws 2 chains, top-k expands 2 nodes."""
    return {"rsd_c": {"kind": "rsd_c", "branching": [2, 2][:depth] + [1] * max(0, depth - 2)},
            "rsd_s": {"kind": "rsd_s", "width": 2}, "spectr": {"kind": "spectr", "k": 2},
            "topk": {"kind": "topk", "k": 2, "width": 2}}


def tree_configs(k: int, draft: dict) -> dict[str, dict]:
    """TREE_METHODS -> speculative_config: `draft` ({method, model}) drafts the trees; ADED needs none."""
    configs = {f"specray_{kind}": {**draft, "num_speculative_tokens": k, "tree": shape}
               for kind, shape in tree_shapes(k).items()}
    configs["specray_aded"] = {"method": "aded", "num_speculative_tokens": k}
    return configs


def skip_reason(method: str, batch_size: int) -> str | None:
    if method in ("hf_prompt_lookup", "hf_assisted") and batch_size > 1:
        return "transformers runs prompt lookup and assisted generation at batch size 1 only"
    if is_padded(method) and batch_size == 1:
        return "padding changes nothing at batch size 1"
    return None


def default_methods(args) -> str:
    """Every method and SERVED_MODE_METHODS (--quick: no trees); specray_eagle and specray_longspec*
    only with their drafts."""
    return ",".join(m for m in METHODS + SERVED_MODE_METHODS if (m != "specray_eagle" or args.eagle_model)
                    and (m not in LONGSPEC_METHODS or args.longspec_model)
                    and not (args.quick and (m in TREE_METHODS or m.endswith("_topk"))))
