"""ADED: a model-free drafter: a tri-gram table plus Monte-Carlo tree search (runs on CPU).

The table starts from a corpus and keeps learning online from every sequence's own committed
tokens (weighted up, since a sequence repeats itself more than it repeats the corpus). Each round a
tree search over continuations of the last two tokens balances exploitation (paths the table finds
likely) against exploration (PUCT bonus for rarely visited children); the most visited nodes form a
deterministic draft tree, verified by one-sample-per-node descent (or greedily).

Corpus: `data/aded_corpus.txt`, short English sentences written for specray (same license as the
project); tokenised with the target's tokenizer when the drafter is built. Nothing is downloaded.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path

from specray.kernels.drafters.base import DraftRequest
from specray.kernels.proposal import Proposal

BUILTIN_CORPUS = Path(__file__).parent / "data" / "aded_corpus.txt"


@dataclass(frozen=True)
class AdedOptions:
    """speculative_config['aded']."""

    corpus: str | None = "builtin"  # "builtin", a text file path, or None (online only)
    tokenizer: str | None = None  # tokenizer source for the corpus; None: the target's (LLM passes it)
    simulations: int = 48  # tree-search simulations per sequence per round
    branching: int = 3  # children considered per node
    max_nodes: int = 12  # draft tokens per tree (verify_budget caps it further)
    exploration: float = 1.0  # PUCT constant
    local_weight: float = 4.0  # weight of the sequence's own tri-grams against the corpus'

    def __post_init__(self) -> None:
        for name in ("simulations", "branching", "max_nodes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"aded {name} must be an integer >= 1, got {v!r}")
        for name in ("exploration", "local_weight"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"aded {name} must be a finite number >= 0, got {v!r}")
        for name in ("corpus", "tokenizer"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"aded {name} must be a string (or null), got {v!r}")

    @classmethod
    def from_dict(cls, raw: dict) -> "AdedOptions":
        if not isinstance(raw, dict):
            raise ValueError(f"aded must be a mapping of ADED options such as {{'simulations': 48}}, got {raw!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown aded keys {unknown}; known keys: {sorted(known)}")
        return cls(**raw)

    def tree_nodes(self, depth: int) -> int:
        """The most draft tokens one tree of this depth holds."""
        return min(self.max_nodes, sum(self.branching ** d for d in range(1, depth + 1)))


class TrigramTable:
    """counts[(a, b)][c] and a bigram fallback counts[b][c]."""

    def __init__(self) -> None:
        self.tri: dict[tuple[int, int], dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.bi: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))

    def add(self, tokens: list[int], start: int = 0, weight: float = 1.0) -> None:
        """Count the tri-grams (and bi-grams) ending at positions >= max(start, 1)."""
        for i in range(max(start, 1), len(tokens)):
            self.bi[tokens[i - 1]][tokens[i]] += weight
            if i >= 2:
                self.tri[(tokens[i - 2], tokens[i - 1])][tokens[i]] += weight

    def counts(self, a: int | None, b: int) -> dict[int, float]:
        return self.tri.get((a, b), {}) if a is not None else {}

    def bigram(self, b: int) -> dict[int, float]:
        return self.bi.get(b, {})


def next_tokens(tables: list[tuple[TrigramTable, float]], a: int | None, b: int, k: int) -> list[tuple[int, float]]:
    """The k likeliest next tokens after (a, b) with their probabilities: tri-grams of every table
    (weighted), else bi-grams."""
    for use_tri in (True, False):
        merged: dict[int, float] = defaultdict(float)
        for table, weight in tables:
            for c, n in (table.counts(a, b) if use_tri else table.bigram(b)).items():
                merged[c] += weight * n
        total = sum(merged.values())
        if total > 0:
            top = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
            return [(c, n / total) for c, n in top]
    return []


@dataclass
class _Node:
    token: int
    context: tuple[int | None, int]  # the two tokens before this node's children
    prior: float  # table probability of this token given its parent
    path_prob: float  # product of priors from the root
    depth: int
    parent: "_Node | None" = None
    children: list["_Node"] = field(default_factory=list)
    expanded: bool = False
    visits: int = 0
    value: float = 0.0


def search_tree(tables, context: list[int], depth: int, budget: int, opts: AdedOptions) -> tuple[list[int], list[int]]:
    """MCTS over continuations of `context` -> (tokens, parents) of the most visited nodes."""
    a = context[-2] if len(context) >= 2 else None
    root = _Node(context[-1], (a, context[-1]), 1.0, 1.0, 0)
    for _ in range(opts.simulations):
        node = root
        while node.expanded and node.children:
            node = max(node.children, key=lambda c: _puct(c, node, opts.exploration))
        if node.depth < depth and not node.expanded:
            node.expanded = True
            for tok, prob in next_tokens(tables, *node.context, opts.branching):
                node.children.append(_Node(tok, (node.context[1], tok), prob, node.path_prob * prob,
                                           node.depth + 1, node))
        reward = node.path_prob  # the chance a table-like target accepts the whole path
        while node is not None:
            node.visits += 1
            node.value += reward
            node = node.parent
    return _most_visited(root, budget)


def _puct(child: _Node, parent: _Node, c: float) -> float:
    q = child.value / child.visits if child.visits else 0.0
    return q + c * child.prior * math.sqrt(parent.visits) / (1 + child.visits)


def _most_visited(root: _Node, budget: int) -> tuple[list[int], list[int]]:
    """The `budget` most visited nodes (a parent is visited at least as often as its child, and
    wins ties by depth, so they form a tree), in level order."""
    nodes, stack = [], list(root.children)
    while stack:
        n = stack.pop()
        if n.visits:
            nodes.append(n)
            stack.extend(n.children)
    kept = sorted(nodes, key=lambda n: (-n.visits, n.depth, -n.path_prob))[:budget]
    kept.sort(key=lambda n: (n.depth, -n.path_prob))
    index = {id(n): i for i, n in enumerate(kept)}
    parents = [-1 if n.parent is root else index[id(n.parent)] for n in kept]
    return [n.token for n in kept], parents


class AdedDrafter:
    name = "aded"

    def __init__(self, options: AdedOptions, corpus: TrigramTable | None = None):
        self.options = options
        self.corpus = corpus or TrigramTable()
        self.local: dict[object, tuple[TrigramTable, int]] = {}  # seq_id -> (table, tokens absorbed)

    @classmethod
    def from_options(cls, raw: dict, tokenizer_source: str | None = None) -> "AdedDrafter":
        opts = AdedOptions.from_dict(raw)
        return cls(opts, load_corpus(opts, opts.tokenizer or tokenizer_source))

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        out = []
        for r in requests:
            table, absorbed = self.local.get(r.seq_id, (TrigramTable(), 0))
            table.add(r.token_ids, start=absorbed)  # online update from the sequence's own tokens
            self.local[r.seq_id] = (table, len(r.token_ids))
            budget = min(self.options.max_nodes, r.verify_budget or self.options.max_nodes)
            if r.num_draft_tokens == 0 or budget == 0:
                out.append(Proposal([]))
                continue
            tables = [(table, self.options.local_weight), (self.corpus, 1.0)]
            tokens, parents = search_tree(tables, r.token_ids, r.num_draft_tokens, budget, self.options)
            out.append(Proposal(tokens, parents=parents, kind="deterministic_tree"))
        return out

    def release(self, seq_id: object) -> None:
        self.local.pop(seq_id, None)


def load_corpus(opts: AdedOptions, tokenizer_source: str | None) -> TrigramTable:
    table = TrigramTable()
    if opts.corpus is None:
        return table
    path = BUILTIN_CORPUS if opts.corpus == "builtin" else Path(opts.corpus)
    if not path.exists():
        raise ValueError(f"aded corpus {str(path)!r} does not exist")
    if tokenizer_source is None:
        raise ValueError("aded's corpus needs a tokenizer: set aded.tokenizer (the target's name or folder)")
    from specray.kernels.loader import resolve

    tok = resolve(tokenizer_source).tokenizer()
    for line in path.read_text().splitlines():
        if line.strip():
            table.add(list(tok(line.strip(), add_special_tokens=False).input_ids))
    return table


def build(options) -> AdedDrafter:
    """The registry's builder (`options`: a DraftOptions); the corpus tokenises with `model` (the target)."""
    return AdedDrafter.from_options(options.aded or {}, tokenizer_source=options.model)
