"""`speculative_config`: vLLM's keys plus specray's own; unknown keys are rejected.

`num_speculative_tokens` is a chain's length, or a tree's depth; `verify_budget` caps the draft
tokens a round verifies (a tree's node count); a request's SamplingParams.num_speculative_tokens
overrides the length/depth (0: off) and SamplingParams.verify_budget lowers the budget for one
request; both stay within the global budget.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from specray.kernels.drafters import registry
from specray.kernels.drafters.aded import AdedOptions
from specray.kernels.drafters.options import DRAFT_QUANTIZATIONS
from specray.kernels.drafters.tree_shapes import TreeSpec
from specray.kernels.verify.rules import KIND_OF_RULE, SAMPLED_RULES

METHODS = tuple(registry.METHODS)
INT_KEYS = ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "draft_num_layers",
            "draft_vocab_trim", "disable_by_batch_size", "verify_budget")  # layer_parallel: the registry's
DRAFT_MODEL_KEYS = ("draft_num_layers", "draft_vocab_trim", "draft_quantization")  # a draft model's only
MAX_SPECULATIVE_TOKENS = 256  # a chain's length or a tree's depth: far past where drafting pays
MAX_ROUND_TOKENS = 4096  # a tree's nodes as grown or verified: past it the draft's KV could not be allocated
VERIFY_CHOICES = ("auto", *SAMPLED_RULES)
# keys no option class checks -> (their type, how an error names it); a wrong type failed later, far
# from its key, as a TypeError (INT_KEYS are checked as integers; tree, aded, longspec by their classes)
TYPES = {"method": (str, "a string"), "model": (str, "a string (an alias or a path)"),
         "batch_size_schedule": (list, "a list of [min_running_seqs, num_draft_tokens] pairs")}


def method_of_draft(name: str) -> str:
    """The method a draft folder is for: eagle or longspec for such a folder, else draft_model (an
    unknown name fails validation later)."""
    from specray.kernels.drafters.loading import draft_method
    from specray.kernels.loader import ModelNotFoundError, resolve

    try:
        return draft_method(resolve(name).path)
    except ModelNotFoundError:
        return "draft_model"


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    model: str | None = None  # draft checkpoint (draft_model; eagle: a feature-level draft; longspec: a LongSpec draft)
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    draft_num_layers: int | None = None  # keep only the draft's first layers (specray)
    # VocabTrim (specray): the draft's LM head keeps its folder's k most frequent tokens; None uses
    # the folder's recommended k (distill.json) where it has a VocabTrim table, 0 turns it off
    draft_vocab_trim: int | None = None
    # Draft weights (specray): "q8_0" rounds the draft to Q8_0 blocks at load (faster drafting
    # on CPU through the packed C kernels, docs/performance.md; lossless, since verification uses the draft's own
    # probabilities), "none" keeps the checkpoint's values; None: "q8_0" on CPU in fp32
    draft_quantization: str | None = None
    disable_by_batch_size: int | None = None  # speculation off once this many sequences run
    # [[min running sequences, draft tokens at most], ...]: shorter, then off, as the batch grows
    batch_size_schedule: list[list[int]] | None = None
    # Trees (specray), method draft_model or eagle: {kind: rsd_c, branching: [2, 2, 1]} | {kind: rsd_s, width: W}
    # | {kind: spectr, k: K} | {kind: topk, k: K, width: W}; the depth is num_speculative_tokens
    tree: dict | None = None
    # Draft tokens (tree nodes) the target verifies per sequence per round, for every method: trees
    # and chains compared at equal target compute. None: no cap beyond the tree's shape.
    verify_budget: int | None = None
    aded: dict | None = None  # ADED options (kernels/drafters/aded.py AdedOptions), method aded
    # LongSpec options, method longspec: {window: W} overrides the draft's trained self-attention window
    longspec: dict | None = None
    # Verification rule for sampled requests: "auto" picks it from each proposal's kind; naming one
    # ("chain", "rrs", "kseq", "descent") makes a proposal of another kind an error, never a fallback
    verify: str = "auto"
    # Prompt lookup first (specray), method draft_model or eagle: a sequence whose last n >= min_match
    # tokens occurred before gets that occurrence's continuation as its proposal (free, point masses);
    # the draft model proposes only where none does. true, or {min_match: 2, max_match: 8, model_tokens:
    # the model's chain length / tree depth at most (the lookup's is num_speculative_tokens)}
    lookup_first: bool | dict | None = None
    # EasySpec layer-parallel drafting (method draft_model): the draft's middle layers in groups of
    # this many whose attentions read the group's input; 1 = ordinary drafting. kernels/layer_parallel.py
    layer_parallel: int | None = None
    # Adaptive length (chains): each round, each sequence drafts the number of tokens, at most
    # num_speculative_tokens, that maximises expected tokens per cost, from its acceptance so far
    # and the target's step costs measured on this machine (cluster/router/adaptive.py)
    adaptive: bool = False

    def __post_init__(self) -> None:
        for key, (kind, what) in TYPES.items():
            if getattr(self, key) is not None and not isinstance(getattr(self, key), kind):
                raise ValueError(f"{key} must be {what}, got {getattr(self, key)!r}")
        for key in INT_KEYS:  # a string or a bool would fail later, far from its key
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{key} must be an integer, got {value!r}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
                             f"got {self.num_speculative_tokens!r}")
        entry = registry.check_options(self.method, self.model, self.tree, self.lookup_first, self.layer_parallel,
                                       aded=self.aded, longspec=self.longspec)
        if not entry.needs_model:  # a model (aded took it for its tokenizer, and crashed) or its options
            self._refuse_draft_model_keys()
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.draft_num_layers is not None and self.draft_num_layers < 1:
            raise ValueError(f"draft_num_layers must be >= 1, got {self.draft_num_layers}")
        if self.draft_vocab_trim is not None and self.draft_vocab_trim < 0:
            raise ValueError(f"draft_vocab_trim must be an integer >= 0, got {self.draft_vocab_trim}")
        if self.draft_quantization not in (None, *DRAFT_QUANTIZATIONS):
            raise ValueError(f"draft_quantization must be one of {DRAFT_QUANTIZATIONS}, got {self.draft_quantization!r}")
        if self.aded is not None:
            AdedOptions.from_dict(self.aded)
        if self.verify not in VERIFY_CHOICES:
            raise ValueError(f"unknown verify rule {self.verify!r}; choose one of {VERIFY_CHOICES}")
        self._check_verify()
        if self.verify_budget is not None and self.verify_budget < 1:
            raise ValueError(f"verify_budget must be an integer >= 1, got {self.verify_budget}")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}")
        self._check_schedule()
        self._check_adaptive()
        nodes = max(self.max_draft_tokens(), self.draft_scratch_tokens())
        if nodes > MAX_ROUND_TOKENS:
            raise ValueError(f"a round's draft holds up to {nodes} tokens a sequence; at most {MAX_ROUND_TOKENS}: "
                             "a smaller tree (or num_speculative_tokens)")

    def _refuse_draft_model_keys(self) -> None:
        needs = f"draft models need method {registry.methods_where('needs_model')}"
        if self.model is not None:
            raise ValueError(f"method {self.method!r} drafts without a model: drop 'model' ({needs})")
        for key in DRAFT_MODEL_KEYS:
            if getattr(self, key) is not None:
                raise ValueError(f"{key!r} shapes a draft model, and method {self.method!r} has none: drop it "
                                 f"({needs})")

    def sampled_kinds(self) -> set[str]:
        """The Proposal kinds this config drafts for sampled requests (greedy ones verify greedily)."""
        if self.method == "aded":
            kinds = {"deterministic_tree"}
        else:
            kinds = {TreeSpec.from_dict(self.tree).sampled_kind if self.tree is not None else "chain"}
        return kinds | ({"chain"} if self.lookup_first not in (None, False) else set())

    def _check_verify(self) -> None:
        """A fixed rule is exact for one proposal kind: refused here where the drafts take another,
        rather than failing every sampled request at its first round."""
        if self.verify == "auto":
            return
        kinds, needed = self.sampled_kinds(), KIND_OF_RULE[self.verify]
        if kinds != {needed}:
            drafts = f"method {self.method!r}" + (" with lookup_first" if self.lookup_first else "") + (
                f" and a {TreeSpec.from_dict(self.tree).kind!r} tree" if self.tree is not None else "")
            raise ValueError(f"verify {self.verify!r} is exact only for {needed!r} proposals, but {drafts} "
                             f"proposes {sorted(kinds)} for sampled requests; use 'auto'")

    def _check_adaptive(self) -> None:
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive must be true or false, got {self.adaptive!r}")
        if self.adaptive and (self.tree is not None or self.method == "aded"):
            raise ValueError("adaptive lengths apply to chains; a tree's shape is fixed by 'tree' (or ADED's "
                             "options): drop 'adaptive' or the tree")

    def model_tokens(self) -> int | None:
        """Draft-model steps a round runs at most: lookup_first's model_tokens, else None (its length)."""
        lookup = self.lookup_first
        return lookup.get("model_tokens") if isinstance(lookup, dict) else None

    def max_draft_tokens(self) -> int:
        """The most draft tokens (tree nodes) one round verifies per sequence: KV to reserve."""
        if self.tree is not None:
            n = TreeSpec.from_dict(self.tree).max_nodes(self.num_speculative_tokens, self.verify_budget)
        elif self.method == "aded":
            n = AdedOptions.from_dict(self.aded or {}).tree_nodes(self.num_speculative_tokens)
        else:
            n = self.num_speculative_tokens
        return n if self.verify_budget is None else min(n, self.verify_budget)

    def draft_scratch_tokens(self) -> int:
        """The most tokens a draft writes past a sequence's committed ones in one round: a chain's
        length, or a tree's nodes as grown (top-k and RSD-C trees grow whole and are cut to the
        budget after, so the budget does not bound their scratch)."""
        if self.tree is None:
            return self.num_speculative_tokens
        tree = TreeSpec.from_dict(self.tree)
        return tree.max_nodes(self.num_speculative_tokens, self.verify_budget if tree.kind in ("rsd_s", "spectr")
                              else None)

    def _check_schedule(self) -> None:
        rows = self.batch_size_schedule or []
        ok = all(isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(x, int) for x in r)
                 and r[0] >= 1 and 0 <= r[1] <= self.num_speculative_tokens for r in rows)
        thresholds = [r[0] for r in rows] if ok else []
        if not ok or thresholds != sorted(set(thresholds)):
            raise ValueError("batch_size_schedule must be [[min_running_seqs, num_draft_tokens], ...] with "
                             "ascending thresholds >= 1 and 0 <= num_draft_tokens <= num_speculative_tokens, "
                             f"got {self.batch_size_schedule}")

    def schedule(self) -> tuple[tuple[int, int], ...]:
        """The load schedule, with disable_by_batch_size folded in as a final (N, 0) step."""
        rows = [(int(t), int(k)) for t, k in self.batch_size_schedule or []]
        if self.disable_by_batch_size is not None:
            rows.append((self.disable_by_batch_size, 0))
        merged: dict[int, int] = {}
        for t, k in rows:
            merged[t] = min(k, merged.get(t, k))
        return tuple(sorted(merged.items()))

    def draft_cap(self, num_running: int) -> int:
        """Draft tokens per sequence the schedule allows while `num_running` sequences run."""
        return min([self.num_speculative_tokens] + [k for t, k in self.schedule() if num_running >= t])

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> "SpeculativeConfig | None":
        if not raw:
            return None
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config must be a dict (e.g. {{'method': 'ngram'}}), got {raw!r}")
        raw = dict(raw)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown speculative_config keys {unknown}; known keys: {sorted(known)}")
        if "method" not in raw:  # as vLLM: a draft without a method is read from the draft (eagle, longspec)
            model = raw.get("model")
            raw["method"] = method_of_draft(model) if isinstance(model, str) and model else "ngram"
        ignored = [k for k in ("prompt_lookup_min", "prompt_lookup_max") if raw.get(k) is not None]
        if ignored and raw["method"] != "ngram":
            raise ValueError(f"{ignored} shape prompt lookup (method 'ngram'); method {raw['method']!r} would ignore "
                             "them (a draft model's lookup first: lookup_first {min_match, max_match})")
        return cls(**raw)
