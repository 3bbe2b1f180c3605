"""Tree verification rules (DESIGN §8 tiers 1-3): exact tiny cases, seeded determinism, and the
exact output distribution by enumerating every draft and verification draw on tiny Markov
"models", against the target's; with negative controls that must differ."""

import itertools

import pytest
import torch

from specray.kernels.proposal import Proposal
from specray.kernels.verify import tree as vt

from enumeration import compose_rounds, enumerate_outcomes, longest_match_over_independent_samples


# -- tier 1: exact tiny cases ---------------------------------------------------------------------
def onehot(tokens, vocab=5):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


def test_greedy_tree_takes_the_matching_path():
    # root -> {1 (node 0), 2 (node 1)}; node 1 -> {3 (node 2), 4 (node 3)}; target argmax: 2, then 4, then 0
    tree = Proposal([1, 2, 3, 4], parents=[-1, -1, 1, 1], kind="deterministic_tree")
    rows = onehot([2, 0, 4, 1, 0])  # row 0: root, row 1 + i: after node i
    res = vt.verify_tree("greedy", rows, tree, vt.GeneratorDraws(None))
    assert res.accepted_token_ids == [2, 4] and res.accepted_nodes == [1, 3]
    assert res.next_token_id == 0 and res.is_bonus  # node 3 is a leaf
    rows = onehot([2, 0, 1, 1, 0])  # after node 1 the argmax is 1: no child matches
    res = vt.verify_tree("greedy", rows, tree, vt.GeneratorDraws(None))
    assert res.emitted_token_ids == [2, 1] and not res.is_bonus


def test_descent_with_point_mass_target_is_greedy():
    tree = Proposal([1, 2, 3, 4], parents=[-1, -1, 1, 1], kind="deterministic_tree")
    res = vt.verify_tree("descent", onehot([2, 0, 3, 1, 0]), tree, vt.GeneratorDraws(torch.Generator()))
    assert res.accepted_nodes == [1, 2] and res.next_token_id == 1 and res.is_bonus


def test_rrs_rejects_a_zero_probability_sibling_and_accepts_the_next():
    p = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0])
    tree = Proposal([1, 2], p.repeat(2, 1), parents=[-1, -1], kind="wor_tree")
    rows = torch.stack([torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])] * 3)  # q: all mass on token 2
    res = vt.verify_tree("rrs", rows, tree, vt.GeneratorDraws(torch.Generator().manual_seed(0)))
    assert res.accepted_nodes == [1] and res.is_bonus


@pytest.mark.parametrize("rule, kind", [("rrs", "wor_tree"), ("kseq", "iid")])
def test_a_row_its_processing_emptied_accepts_no_draft_token(rule, kind):
    """An all -inf row after processing (allowed tokens all banned) is NaN once normalised: min(1,
    NaN) kept 1.0 and the tree rules accepted the draft token every time, where plain decoding
    and the chain rule never draw it."""
    p = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0])
    tree = Proposal([1, 2], p.repeat(2, 1), parents=[-1, -1], kind=kind, counts=[1, 1] if kind == "iid" else None)
    rows = torch.full((3, 5), float("nan"))
    for seed in range(20):
        res = vt.verify_tree(rule, rows, tree, vt.GeneratorDraws(torch.Generator().manual_seed(seed)))
        assert res.accepted_nodes == [] and res.accepted_token_ids == [], (seed, res)


def test_rule_kind_mismatch_is_an_error():
    tree = Proposal([1, 2], parents=[-1, -1], kind="deterministic_tree")
    rows = torch.full((3, 5), 0.2)
    for rule in ("chain", "rrs", "kseq"):
        with pytest.raises(ValueError, match="cannot verify"):
            vt.verify_tree(rule, rows, tree, vt.GeneratorDraws(None))
    with pytest.raises(AssertionError):
        Proposal([1, 1], torch.full((2, 5), 0.2), parents=[-1, -1], kind="wor_tree")  # duplicate siblings


def test_kseq_rho_solves_its_fixed_point():
    g = torch.Generator().manual_seed(0)
    for k in (2, 3, 5):
        p, q = torch.rand(7, generator=g).softmax(0), (3 * torch.rand(7, generator=g)).softmax(0)
        rho = vt.kseq_rho(p, q, k)
        beta = vt.kseq_beta(p.double(), q.double(), rho)
        assert 1.0 <= rho <= k
        assert abs(1 - (1 - beta) ** k - rho * beta) < 1e-9
        assert (vt.kseq_residual(p, q, rho, k) >= 0).all()
    p = torch.tensor([0.3, 0.7])
    assert vt.kseq_rho(p, p, 4) == 1.0 and vt.kseq_rho(p, torch.tensor([0.9, 0.1]), 1) == 1.0


# -- tier 2: determinism --------------------------------------------------------------------------
def test_seeded_tree_verification_is_reproducible():
    torch.manual_seed(0)
    p = torch.rand(6).softmax(0)
    trees = [Proposal([1, 2, 0], p.repeat(3, 1), parents=[-1, -1, 0], kind="wor_tree"),
             Proposal([3, 4], p.repeat(2, 1), parents=[-1, 0], kind="iid", counts=[2, 2])]
    rows = torch.rand(7, 6).softmax(-1)
    run = lambda: [r.emitted_token_ids for r in vt.verify_trees(  # noqa: E731
        "rrs", rows[:4], trees[:1], [torch.Generator().manual_seed(5)])]
    assert run() == run()
    a = vt.verify_trees("kseq", rows[4:], trees[1:], [torch.Generator().manual_seed(9)])
    b = vt.verify_trees("kseq", rows[4:], trees[1:], [torch.Generator().manual_seed(9)])
    assert a[0].emitted_token_ids == b[0].emitted_token_ids


# -- tier 3: the exact output distribution, by enumeration ------------------------------------------
VOCAB = 3


def tables(seed):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(VOCAB, VOCAB, generator=g) * 3).softmax(-1).double()  # target q(next | prev)
    p = (torch.rand(VOCAB, VOCAB, generator=g) * 3).softmax(-1).double()  # draft p(next | prev)
    return q, p


def wor_tree(p, ctx, branching, draws):
    """Siblings drawn one by one without replacement (the order Gumbel-top-k yields)."""
    tokens, parents, probs, frontier = [], [], [], [(-1, ctx)]
    for b in branching:
        nxt = []
        for node, last in frontier:
            w = p[last].clone()
            for _ in range(min(b, VOCAB)):
                x = draws.categorical(w)
                w[x] = 0.0
                tokens.append(x), parents.append(node), probs.append(p[last])
                nxt.append((len(tokens) - 1, x))
        frontier = nxt
    return Proposal(tokens, torch.stack(probs).float(), parents=parents, kind="wor_tree")


def iid_tree(p, ctx, k, depth, draws):
    """k i.i.d. chains from p, merged into their prefix trie with counts."""
    chains = []
    for _ in range(k):
        last, chain = ctx, []
        for _ in range(depth):
            last = draws.categorical(p[last])
            chain.append(last)
        chains.append(chain)
    index, tokens, parents, counts, probs = {}, [], [], [], []
    for chain in chains:
        parent, last = -1, ctx
        for x in chain:
            key = (parent, x)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(x), parents.append(parent), counts.append(0), probs.append(p[last])
            parent, last = index[key], x
            counts[parent] += 1
    return Proposal(tokens, torch.stack(probs).float(), parents=parents, kind="iid", counts=counts)


def topk_tree(p, ctx, branching, draws):
    tokens, parents, frontier = [], [], [(-1, ctx)]
    for b in branching:
        nxt = []
        for node, last in frontier:
            for x in p[last].topk(min(b, VOCAB)).indices.tolist():
                tokens.append(x), parents.append(node)
                nxt.append((len(tokens) - 1, x))
        frontier = nxt
    return Proposal(tokens, parents=parents, kind="deterministic_tree")


def target_rows(q, ctx, proposal):
    return torch.stack([q[ctx]] + [q[t] for t in proposal.draft_token_ids]).float()


def round_distribution(q, p, build, verify):
    def one(ctx):
        def fn(draws):
            proposal = build(p, ctx, draws)
            return tuple(verify(target_rows(q, ctx, proposal), proposal, draws).emitted_token_ids)
        return enumerate_outcomes(fn)
    return one


def target_joint(q, start, n):
    out = {}
    for seq in itertools.product(range(VOCAB), repeat=n):
        pr, last = 1.0, start
        for x in seq:
            pr, last = pr * float(q[last, x]), x
        out[seq] = pr
    return out


def total_variation(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def rule(name):
    return lambda rows, proposal, draws: vt.verify_tree(name, rows, proposal, draws)


CASES = {
    "rrs_binary": (lambda p, c, d: wor_tree(p, c, [2, 2], d), rule("rrs")),
    "rrs_wide": (lambda p, c, d: wor_tree(p, c, [3, 1], d), rule("rrs")),
    "kseq_k2": (lambda p, c, d: iid_tree(p, c, 2, 2, d), rule("kseq")),
    "kseq_k3": (lambda p, c, d: iid_tree(p, c, 3, 1, d), rule("kseq")),
    "descent": (lambda p, c, d: topk_tree(p, c, [2, 2], d), rule("descent")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_output_distribution_equals_target(case):
    q, p = tables(seed=3)
    build, verify = CASES[case]
    got = compose_rounds(round_distribution(q, p, build, verify), start=0, num_tokens=3)
    want = target_joint(q, 0, 3)
    assert total_variation(got, want) < 1e-5, (case, total_variation(got, want))
    assert abs(sum(got.values()) - 1.0) < 1e-6


def kseq_without_rho(rows, proposal, draws):
    """K-SEQ with rho = 1 for k > 1 candidates: accepts too often."""
    original = vt.kseq_rho
    vt.kseq_rho = lambda p, q, k, iters=60: 1.0
    try:
        return vt.verify_tree("kseq", rows, proposal, draws)
    finally:
        vt.kseq_rho = original


def rrs_keeping_replacement(rows, proposal, draws):
    """RRS that forgets the siblings were drawn without replacement (keeps p unchanged)."""
    step = vt.STEPS["rrs"]

    def iid_like(row, children, prop, d):
        q = row.double().clone()
        p = prop.draft_probs[children[0]].double()
        for c in children:
            x = prop.draft_token_ids[c]
            if d.bernoulli(float(min(1.0, q[x] / p[x]))):
                return c, None
            q = vt.residual_distribution(q, p)
        return None, d.categorical(q)

    assert step is vt.rrs_step
    return vt.walk(iid_like, rows, proposal, draws, draws.categorical)


NEGATIVE = {
    "longest_match": (lambda p, c, d: topk_tree(p, c, [2], d), longest_match_over_independent_samples),
    "kseq_rho_1": (CASES["kseq_k3"][0], kseq_without_rho),
    "rrs_with_replacement": (CASES["rrs_wide"][0], rrs_keeping_replacement),
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_negative_controls_differ_from_target(case):
    q, p = tables(seed=3)
    build, verify = NEGATIVE[case]
    got = compose_rounds(round_distribution(q, p, build, verify), start=0, num_tokens=3)
    assert total_variation(got, target_joint(q, 0, 3)) > 1e-3
