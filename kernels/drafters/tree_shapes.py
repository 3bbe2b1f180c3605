"""How each tree drafter grows its tree, one level at a time, from the draft's distributions.

Pure functions of draft rows p (processed probabilities, [vocab_size]) and a generator, so tests
can drive them with tiny tables. A builder holds the tree so far and its frontier (the nodes whose
draft distributions the next level needs, in order). Node order is level order: parents precede
children, and a prefix of the nodes is itself a tree.

- rsd_c (RSD-C): each node at depth d gets branching[d] children drawn without replacement from p
  with the Gumbel-top-k trick (the top-b of log p + Gumbel noise is an ordered sample without
  replacement);
- rsd_s (RSD-S): stochastic beam search: W sequences without replacement over depth L; children
  carry Gumbels conditioned on their parent's, and only the W best partial sequences are expanded
  (unlikely paths are dropped early);
- spectr (SpecTr): k i.i.d. chains from p, merged into their prefix trie with counts;
- topk (EAGLE-2 style): deterministic; the `width` most likely frontier nodes (by path
  probability) get their top-k children; the `budget` most likely nodes are kept at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specray.kernels.proposal import Proposal

TREE_KINDS = ("rsd_c", "rsd_s", "spectr", "topk")


def _count(v) -> bool:
    """An integer >= 1 (a bool is no count)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class TreeSpec:
    """speculative_config['tree']. The depth of a tree is the round's num_draft_tokens (capped by
    len(branching) for rsd_c); `budget` caps the nodes (draft tokens) one tree may hold."""

    kind: str
    branching: tuple[int, ...] = ()  # rsd_c: children per node at depth 1, 2, ...
    width: int = 4  # rsd_s: beam width W; topk: nodes expanded per depth
    k: int = 4  # spectr: number of i.i.d. chains; topk: children per expanded node

    def __post_init__(self) -> None:
        if self.kind not in TREE_KINDS:
            raise ValueError(f"unknown tree kind {self.kind!r}; choose one of {TREE_KINDS}")
        if self.kind == "rsd_c" and (not self.branching or any(not _count(b) for b in self.branching)):
            raise ValueError(f"rsd_c needs branching: a list of integers >= 1, got {list(self.branching)}")
        if self.kind != "rsd_c" and self.branching:
            raise ValueError("branching belongs to rsd_c trees")
        for name in ("width", "k"):
            v = getattr(self, name)
            if not _count(v):
                raise ValueError(f"tree {name} must be an integer >= 1, got {v!r}")

    @property
    def sampled_kind(self) -> str:
        """The Proposal kind this tree makes for a sampled request (a greedy one's is always a
        deterministic tree): it names the rule that verifies it exactly (kernels/verify/rules.py)."""
        return {"spectr": "iid", "topk": "deterministic_tree"}.get(self.kind, "wor_tree")

    @classmethod
    def from_dict(cls, raw: dict) -> "TreeSpec":
        if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
            raise ValueError(f"tree must be a mapping with a 'kind' ({TREE_KINDS}), got {raw!r}")
        allowed = {"rsd_c": {"kind", "branching"}, "rsd_s": {"kind", "width"}, "spectr": {"kind", "k"},
                   "topk": {"kind", "k", "width"}}.get(raw["kind"], {"kind"})
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ValueError(f"unknown keys {unknown} for tree kind {raw['kind']!r}; known: {sorted(allowed)}")
        raw = dict(raw)
        if "branching" in raw:
            if not isinstance(raw["branching"], (list, tuple)):
                raise ValueError(f"rsd_c needs branching: a list of integers >= 1, got {raw['branching']!r}")
            raw["branching"] = tuple(raw["branching"])
        return cls(**raw)

    def depth(self, num_draft_tokens: int) -> int:
        return min(num_draft_tokens, len(self.branching)) if self.kind == "rsd_c" else num_draft_tokens

    def shape(self, depth: int, budget: int | None) -> tuple[int, int]:
        """(width, depth) for rsd_s / spectr so that width * depth <= budget (no truncation)."""
        width = self.width if self.kind == "rsd_s" else self.k
        if budget is None or depth == 0:
            return width, depth
        depth = min(depth, budget)
        return max(1, min(width, budget // max(depth, 1))), depth

    def max_nodes(self, depth: int, budget: int | None = None) -> int:
        """The most draft tokens one tree holds."""
        if self.kind == "rsd_c":
            total, level = 0, 1
            for b in self.branching[:depth]:
                level *= b
                total += level
        elif self.kind == "topk":
            total = min(self.k, 1 << 30) + max(0, depth - 1) * self.width * self.k
        else:
            width, d = self.shape(depth, None)
            total = width * d
        return total if budget is None else min(total, budget)


@dataclass
class TreeBuild:
    """A tree under construction; `frontier` lists the nodes to expand next (-1: the root)."""

    kind: str  # the Proposal kind it becomes
    tokens: list[int] = field(default_factory=list)  # [num_nodes]
    parents: list[int] = field(default_factory=list)  # [num_nodes]
    rows: list[torch.Tensor] = field(default_factory=list)  # [num_nodes] draft row each node was drawn from
    counts: list[int] = field(default_factory=list)  # [num_nodes] spectr only
    scores: list[float] = field(default_factory=list)  # [num_nodes] path log-prob (topk) or Gumbel (rsd_s)
    logps: list[float] = field(default_factory=list)  # [num_nodes] rsd_s: path log-prob under the draft
    frontier: list[int] = field(default_factory=lambda: [-1])
    frontier_counts: list[int] = field(default_factory=list)  # spectr: chains through each frontier node

    def add(self, token: int, parent: int, row: torch.Tensor | None, score: float = 0.0, count: int = 0,
            logp: float = 0.0) -> int:
        self.logps.append(logp)
        self.tokens.append(token)
        self.parents.append(parent)
        if row is not None:
            self.rows.append(row)
        self.scores.append(score)
        if self.kind == "iid":
            self.counts.append(count)
        return len(self.tokens) - 1

    def score_of(self, node: int) -> float:
        return 0.0 if node < 0 else self.scores[node]

    def proposal(self, limit: int | None = None) -> Proposal:
        n = len(self.tokens) if limit is None else min(limit, len(self.tokens))
        probs = torch.stack(self.rows[:n]) if self.rows and n else None
        if self.kind == "deterministic_tree":
            probs = None
        return Proposal(self.tokens[:n], probs, parents=self.parents[:n], kind=self.kind,
                        counts=self.counts[:n] if self.kind == "iid" else None)


def gumbel(shape, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, dtype=torch.float64).clamp(1e-300, 1.0 - 1e-16)
    return -torch.log(-torch.log(u))


def support(p: torch.Tensor) -> torch.Tensor:
    """Token ids with p > 0 [n]: the only ones a Gumbel draw can pick (the rest score -inf), so draws
    over the support alone are exact and, with VocabTrim or top-k/top-p, several times cheaper."""
    return (p > 0).nonzero().squeeze(1)


def gumbel_top_k(p: torch.Tensor, k: int, generator: torch.Generator | None) -> list[int]:
    """An ordered sample of min(k, support) tokens without replacement from p [vocab_size]."""
    ids = support(p)  # [n]
    scores = p[ids].double().log() + gumbel(ids.shape, generator)
    return ids[scores.topk(min(k, ids.numel())).indices].tolist()


def grow_rsd_c(build: TreeBuild, rows: torch.Tensor, branching: int, generator) -> None:
    """rows [len(frontier), vocab_size]."""
    frontier = []
    for node, p in zip(build.frontier, rows, strict=True):
        for x in gumbel_top_k(p, branching, generator):
            frontier.append(build.add(x, node, p))
    build.frontier = frontier


def _conditioned_gumbels(phi: torch.Tensor, bound: float, generator) -> torch.Tensor:
    """Gumbels with locations phi [n] conditioned on their maximum being `bound`
    (stochastic beam search), in the numerically stable form."""
    g = phi + gumbel(phi.shape, generator)
    z = g.max()
    a = (g - z).clamp_max(0.0)  # log1mexp argument, <= 0
    log1mexp = torch.where(a > -0.693, torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))
    v = bound - g + log1mexp
    return bound - v.clamp_min(0.0) - torch.log1p(torch.exp(-v.abs()))


def grow_rsd_s(build: TreeBuild, rows: torch.Tensor, width: int, generator) -> None:
    """Stochastic beam search: expand every frontier beam, keep the `width` best children overall."""
    candidates = []  # (gumbel, parent, token, row, path log-prob)
    for node, p in zip(build.frontier, rows, strict=True):
        ids = support(p)  # [n]: tokens off the support have phi = -inf and never move the maximum
        phi = p[ids].double().log() + (0.0 if node < 0 else build.logps[node])  # [n] path log-probs
        gumbels = _conditioned_gumbels(phi, build.score_of(node), generator)
        top = gumbels.topk(min(width, ids.numel()))
        candidates += [(float(g), node, int(ids[j]), p, float(phi[j])) for g, j in zip(top.values, top.indices)]
    kept = sorted(candidates, key=lambda c: -c[0])[:width]
    kept.sort(key=lambda c: (build.frontier.index(c[1]), -c[0]))  # siblings together, best first
    build.frontier = [build.add(x, parent, p, score=g, logp=lp) for g, parent, x, p, lp in kept]


def grow_spectr(build: TreeBuild, rows: torch.Tensor, generator) -> None:
    """Each of the chains through a frontier node draws its next token i.i.d. from the node's p."""
    frontier, counts = [], []
    for node, count, p in zip(build.frontier, build.frontier_counts, rows, strict=True):
        draws = torch.multinomial(p.double(), count, replacement=True, generator=generator).tolist()
        children: dict[int, int] = {}
        for x in draws:  # first-occurrence order; the verifier randomises the order itself
            if x not in children:
                children[x] = build.add(x, node, p, count=0)
                frontier.append(children[x])
            build.counts[children[x]] += 1
        counts += [build.counts[c] for c in children.values()]
    build.frontier, build.frontier_counts = frontier, counts


def _children(build: TreeBuild, rows: torch.Tensor, k: int) -> list[tuple[float, int, int]]:
    """Each frontier node's k most likely children as (path log-prob, parent node, token), frontier
    order, then rank; rows [len(frontier), vocab_size] of log-probabilities."""
    children = []
    for node, logp in zip(build.frontier, rows, strict=True):
        top = logp.topk(min(k, logp.shape[0]))
        children += [(build.score_of(node) + float(s), node, int(x)) for s, x in zip(top.values, top.indices)
                     if s > -math.inf]
    return children


def grow_topk(build: TreeBuild, rows: torch.Tensor, k: int, width: int | None) -> None:
    """rows [len(frontier), vocab_size] of log-probabilities; deterministic."""
    new = [build.add(x, node, None, score=s) for s, node, x in _children(build, rows, k)]
    ranked = sorted(new, key=lambda i: -build.scores[i])
    build.frontier = sorted(ranked if width is None else ranked[:width])


def grow_beam(build: TreeBuild, rows: torch.Tensor, width: int) -> None:
    """rows [len(frontier), vocab_size] of log-probabilities; deterministic: the `width` children
    of the whole frontier with the highest path log-probability, and nothing else (a beam of
    `width` a level: RSD-S's and SpecTr's `width` x depth nodes for a greedy request, which
    `TreeSpec.max_nodes` counts; `grow_topk` would add width children to every frontier node)."""
    best = sorted(_children(build, rows, width), key=lambda c: -c[0])[:width]  # stable: ties in frontier order
    build.frontier = sorted(build.add(x, node, None, score=s) for s, node, x in sorted(best, key=lambda c: c[1]))


def keep_most_likely(build: TreeBuild, budget: int) -> TreeBuild:
    """EAGLE-2 reranking: the `budget` nodes with the highest path log-prob (ancestors never score
    lower than their descendants, so the kept set is a tree), renumbered in level order."""
    if len(build.tokens) <= budget:
        return build
    depth = [0] * len(build.tokens)
    for i, p in enumerate(build.parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    kept = sorted(sorted(range(len(build.tokens)), key=lambda i: (-build.scores[i], depth[i]))[:budget])
    new_index = {old: new for new, old in enumerate(kept)}
    out = TreeBuild(build.kind)
    for old in kept:
        parent = build.parents[old]
        assert parent < 0 or parent in new_index, "a kept node's parent is kept"
        out.add(build.tokens[old], -1 if parent < 0 else new_index[parent], None, build.scores[old])
    return out
