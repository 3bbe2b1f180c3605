"""Tree drafters' sampling: Gumbel-top-k is sequential sampling without replacement, stochastic
beam search keeps W distinct sequences, SpecTr tries merge into a trie with counts; budgets hold;
tree options are validated."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specray.kernels.drafters import tree_shapes as ts


def test_gumbel_top_k_is_ordered_sampling_without_replacement():
    p = torch.tensor([0.5, 0.0, 0.25, 0.15, 0.1])  # a hole in the support: ids map back through it
    g = torch.Generator().manual_seed(0)
    n = 20_000
    pairs = np.array([ts.gumbel_top_k(p, 2, g) for _ in range(n)])
    assert (pairs != 1).all()  # zero-probability tokens are never drawn
    order = list(itertools.permutations([0, 2, 3, 4], 2))
    observed = np.array([((pairs[:, 0] == a) & (pairs[:, 1] == b)).sum() for a, b in order])
    want = np.array([float(p[a] * p[b] / (1 - p[a])) for a, b in order])
    assert chisquare(observed, want / want.sum() * n).pvalue > 1e-3
    assert ts.gumbel_top_k(p, 9, g) and len(ts.gumbel_top_k(p, 9, g)) == 4  # capped by the support


def test_rsd_s_keeps_width_distinct_sequences():
    g = torch.Generator().manual_seed(1)
    build = ts.TreeBuild("wor_tree")
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    ts.grow_rsd_s(build, p.unsqueeze(0), 3, g)
    assert len(build.tokens) == 3 and len(set(build.tokens)) == 3 and build.parents == [-1, -1, -1]
    ts.grow_rsd_s(build, p.repeat(3, 1), 3, g)
    level2 = list(zip(build.parents[3:], build.tokens[3:]))
    assert len(level2) == 3 and len(set(level2)) == 3  # 3 distinct depth-2 sequences
    assert all(s <= build.score_of(par) + 1e-9 for par, s in zip(build.parents[3:], build.scores[3:]))
    proposal = build.proposal()
    assert proposal.kind == "wor_tree" and proposal.num_draft_tokens == 6


def test_spectr_trie_counts_add_up():
    g = torch.Generator().manual_seed(2)
    build = ts.TreeBuild("iid", frontier_counts=[5])
    p = torch.tensor([0.6, 0.3, 0.1])
    ts.grow_spectr(build, p.unsqueeze(0), g)
    assert sum(build.counts) == 5
    ts.grow_spectr(build, p.repeat(len(build.frontier), 1), g)
    first = [i for i, par in enumerate(build.parents) if par == -1]
    for node in first:
        assert build.counts[node] == sum(c for c, par in zip(build.counts, build.parents) if par == node)
    proposal = build.proposal()
    assert proposal.kind == "iid" and proposal.counts == build.counts


def test_topk_reranking_keeps_a_tree_within_budget():
    build = ts.TreeBuild("deterministic_tree")
    logp = torch.tensor([0.5, 0.3, 0.2]).log()
    ts.grow_topk(build, logp.unsqueeze(0), 3, 2)
    ts.grow_topk(build, logp.repeat(2, 1), 3, 2)
    kept = ts.keep_most_likely(build, 5)
    assert len(kept.tokens) == 5 and all(-1 <= p < i for i, p in enumerate(kept.parents))
    assert kept.proposal().kind == "deterministic_tree"


def test_a_greedy_beam_keeps_width_nodes_a_level():
    """grow_beam: the `width` best paths over the whole frontier, ties in frontier order; the
    width x depth nodes `max_nodes` counts for RSD-S and SpecTr."""
    build = ts.TreeBuild("deterministic_tree")
    logp = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    ts.grow_beam(build, logp.unsqueeze(0), 3)
    assert build.tokens == [0, 1, 2] and build.frontier == [0, 1, 2]
    ts.grow_beam(build, torch.stack([logp, logp.flip(0), logp]), 3)
    # paths: 0.5 x 0.5 = .25 (0 -> 0), 0.3 x 0.5 (1 -> 3), 0.5 x 0.3 (0 -> 1): 0.15 tie, frontier order
    assert list(zip(build.parents[3:], build.tokens[3:])) == [(0, 0), (0, 1), (1, 3)]
    ts.grow_beam(build, logp.repeat(3, 1), 3)
    assert len(build.tokens) == 9 == ts.TreeSpec("rsd_s", width=3).max_nodes(3)
    assert all(-1 <= p < i for i, p in enumerate(build.parents))


def test_shapes_fit_the_budget():
    spec = ts.TreeSpec("rsd_s", width=4)
    assert spec.shape(3, 6) == (2, 3) and spec.shape(3, None) == (4, 3) and spec.shape(5, 2) == (1, 2)
    assert ts.TreeSpec("rsd_c", branching=(2, 2, 1)).max_nodes(3) == 2 + 4 + 4
    assert ts.TreeSpec("rsd_c", branching=(2, 2, 1)).depth(5) == 3


@pytest.mark.parametrize("raw, match", [
    ({"kind": "rsd_c", "branching": [2, 0]}, "branching"),
    ({"kind": "topk", "k": 2, "depth": 3}, "unknown keys"),
    ({"kind": "eagle"}, "unknown tree kind"),
    ({"branching": [2]}, "kind"),
])
def test_tree_options_are_validated(raw, match):
    with pytest.raises(ValueError, match=match):
        ts.TreeSpec.from_dict(raw)


def test_rsd_s_trees_under_rrs_are_lossless():
    """Stochastic beam search trees (their Gumbels are continuous, so sampled rather than
    enumerated): the first two emitted tokens follow the target's joint distribution."""
    from specray.kernels.verify import tree as vt

    vocab, n = 4, 5_000
    g = torch.Generator().manual_seed(4)
    q = (torch.rand(vocab, vocab, generator=g) * 3).softmax(-1)  # target q(next | prev)
    p = (torch.rand(vocab, vocab, generator=g) * 3).softmax(-1)  # draft p(next | prev)

    def round_from(ctx):
        build = ts.TreeBuild("wor_tree")
        rows = p[ctx].unsqueeze(0)
        for _ in range(2):
            ts.grow_rsd_s(build, rows, 2, g)
            rows = p[torch.tensor([build.tokens[i] for i in build.frontier])]
        proposal = build.proposal()
        target = torch.stack([q[ctx]] + [q[t] for t in proposal.draft_token_ids])
        return vt.verify_tree("rrs", target, proposal, vt.GeneratorDraws(g)).emitted_token_ids

    pairs = []
    for _ in range(n):
        out = round_from(0)
        if len(out) < 2:
            out += round_from(out[-1])
        pairs.append(out[0] * vocab + out[1])
    observed = np.bincount(pairs, minlength=vocab * vocab)
    want = (q[0].unsqueeze(1) * q).reshape(-1).double().numpy()
    assert chisquare(observed, want * n).pvalue > 1e-3
