"""The one table of speculative methods: a method name -> its builder and the options it takes.

`speculative_config` validation, the CLI's choices, the draft worker and the README's method list
all derive from `METHODS`. Adding a method: a module under kernels/drafters/ with a
`build(options) -> Drafter`, one entry here, its tests. Builders are named "module:function" and
imported on first use, so that the CLI can list the methods without loading torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specray.kernels.drafters.options import DraftOptions

if TYPE_CHECKING:
    from specray.kernels.drafters.base import Drafter


@dataclass(frozen=True)
class Method:
    name: str
    builder: str  # "module:function" under specray.kernels.drafters, taking a DraftOptions
    summary: str  # one line for --help and the README
    needs_model: bool = False  # speculative_config['model'] names a draft checkpoint
    grows_trees: bool = False  # takes speculative_config['tree']
    takes_lookup_first: bool = False  # may sit behind prompt lookup
    own_options: str | None = None  # the speculative_config key holding its own options
    layer_parallel: bool = False  # its draft model's layers can run in EasySpec groups
    # what the target returns for the draft each round (SeqSpec.features): "hidden" (final hidden
    # states) or "last_kv" (the last layer's keys and values); None: nothing
    target_features: str | None = None

    def build(self, options: DraftOptions, workers=None) -> "Drafter":
        """`workers`: a layer-parallel draft group's TPGroup (methods with layer_parallel only)."""
        module, function = self.builder.split(":")
        builder = getattr(importlib.import_module(f"specray.kernels.drafters.{module}"), function)
        return builder(options) if workers is None else builder(options, workers)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ngram", "ngram:build", "prompt lookup: the continuation of an earlier n-gram match"),
    Method("draft_model", "loading:build_draft_model", "a standalone draft model (chains or trees)",
           needs_model=True, grows_trees=True, takes_lookup_first=True, layer_parallel=True),
    Method("eagle", "loading:build_eagle", "a feature-level draft reading the target's hidden states",
           needs_model=True, grows_trees=True, takes_lookup_first=True, target_features="hidden"),
    Method("longspec", "loading:build_longspec", "LongSpec: a one-layer draft with a constant-size window "
           "cross-attending the target's last-layer KV", needs_model=True, grows_trees=True,
           takes_lookup_first=True, own_options="longspec", target_features="last_kv"),
    Method("aded", "aded:build", "adaptive tri-gram drafting with tree search (ADED)", own_options="aded"),
)}


def method(name: str) -> Method:
    if name == "none":  # the CLI flag's value; a config has no method for it
        raise ValueError("speculative method 'none' is the CLI's --speculative-method none; in a config or "
                         "speculative_config, null (or leaving it out) turns speculation off")
    if name not in METHODS:
        raise ValueError(f"unknown speculative method {name!r}; choose one of {tuple(METHODS)}")
    return METHODS[name]


def methods_where(flag: str) -> str:
    return " or ".join(repr(m.name) for m in METHODS.values() if getattr(m, flag))


def check_options(name: str, model: str | None = None, tree: dict | None = None,
                  lookup_first: bool | dict | None = None, layer_parallel: int | None = None,
                  **own: dict | None) -> Method:
    """Refuse options the method does not take, naming the key; returns the method's entry."""
    entry = method(name)
    if layer_parallel is not None:
        if not entry.layer_parallel:
            raise ValueError(f"'layer_parallel' needs method {methods_where('layer_parallel')} (a draft with "
                             f"layers to group; got {name!r})")
        if not isinstance(layer_parallel, int) or isinstance(layer_parallel, bool) or layer_parallel < 1:
            raise ValueError(f"layer_parallel must be an integer >= 1, got {layer_parallel!r}")
    if entry.needs_model and not model:
        raise ValueError(f"speculative method {name!r} needs a draft 'model'")
    if tree is not None:
        if not entry.grows_trees:
            raise ValueError(f"'tree' needs method {methods_where('grows_trees')} (got {name!r})")
        from specray.kernels.drafters.tree_shapes import TreeSpec

        TreeSpec.from_dict(tree)  # raises ValueError naming the bad key or kind
    if lookup_first not in (None, False):
        if not entry.takes_lookup_first:
            raise ValueError(f"'lookup_first' needs method {methods_where('takes_lookup_first')} (got {name!r})")
        from specray.kernels.drafters.hybrid import LookupOptions

        LookupOptions.from_dict(lookup_first)
    for key, value in own.items():
        if value is not None and entry.own_options != key:
            raise ValueError(f"'{key}' options need method {key!r}, got {name!r}")
    if own.get("longspec") is not None:
        from specray.kernels.drafters.longspec_folder import LongSpecOptions

        LongSpecOptions.from_dict(own["longspec"])
    return entry


def build_drafter(options: DraftOptions, workers=None) -> "Drafter":
    """The drafter `options` describe; a bad option raises ValueError naming it. `workers`: this
    process's rank in a layer-parallel draft group."""
    entry = check_options(options.method, options.model, options.tree, options.lookup_first, options.layer_parallel,
                          aded=options.aded, longspec=options.longspec)
    if workers is not None and workers.size > 1 and not entry.layer_parallel:
        raise ValueError(f"a draft group of {workers.size} workers needs 'layer_parallel' (method "
                         f"{methods_where('layer_parallel')})")
    drafter = entry.build(options, workers)
    if options.lookup_first not in (None, False):
        from specray.kernels.drafters.hybrid import LookupFirstDrafter, LookupOptions

        return LookupFirstDrafter(drafter, LookupOptions.from_dict(options.lookup_first))
    return drafter
