"""Tree verification rules (DESIGN §3), one walk from the pending token down the proposal's tree.

Rows: row 0 is the target's distribution after the pending token, row 1 + i after draft node i.
At each node the rule either accepts one child (and descends) or emits a recovered token; at a
leaf it emits the bonus token from the target. Each rule is exact for its proposal kind:

- greedy: descend into the child equal to the target argmax, else emit the argmax;
- descent (deterministic trees): draw y ~ q at the node, descend into the child equal to y, else emit y;
- rrs (siblings drawn without replacement from p, RSD): try siblings in order, accepting x with
  min(1, q(x)/p(x)); on rejection q <- norm(max(q - p, 0)) and p <- p without x, renormalised;
  after the last sibling emit the recovered token from q;
- kseq (k i.i.d. candidates, SpecTr): try the k candidates in a uniformly random order, accepting x
  with min(1, q(x)/(rho* p(x))); if all fail emit the recovered token from the K-SEQ residual.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specray.kernels.cpu_ops import argmax_rows
from specray.kernels.draws import Draws, GeneratorDraws
from specray.kernels.proposal import Proposal, VerifyResult
from specray.kernels.sampling import Generators
from specray.kernels.verify.rules import check_rule

# A node step: (q row [vocab_size], children node ids, proposal, draws) -> (accepted child | None, recovered | None)
Step = Callable[[torch.Tensor, list[int], Proposal, Draws], tuple[int | None, int | None]]


def children_lists(parents: list[int]) -> list[list[int]]:
    """[num_nodes + 1] children per node, index 0 for the pending token, 1 + i for node i."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return kids


def walk(step: Step, rows: torch.Tensor, proposal: Proposal, draws: Draws,
         leaf_token: Callable[[torch.Tensor], int]) -> VerifyResult:
    """rows [num_nodes + 1, vocab_size] -> the accepted path and the recovered or bonus token."""
    assert rows.shape[0] == proposal.num_draft_tokens + 1
    kids = children_lists(proposal.tree_parents())
    node, path = -1, []
    while True:
        row, children = rows[node + 1], kids[node + 1]
        if not children:  # a leaf (or an empty proposal): bonus from the target
            return _result(proposal, path, leaf_token(row), True)
        child, recovered = step(row, children, proposal, draws)
        if child is None:
            assert recovered is not None
            return _result(proposal, path, recovered, False)
        path.append(child)
        node = child


def _result(proposal: Proposal, path: list[int], next_token: int, at_leaf: bool) -> VerifyResult:
    ids = [proposal.draft_token_ids[i] for i in path]
    if not proposal.is_tree:
        return VerifyResult(ids, next_token, at_leaf, proposal.num_draft_tokens)
    return VerifyResult(ids, next_token, at_leaf, proposal.num_draft_tokens, accepted_nodes=list(path))


def _argmax(row: torch.Tensor) -> int:
    return int(argmax_rows(row.unsqueeze(0))[0])


# -- node steps -----------------------------------------------------------------------------------
def greedy_step(row, children, proposal, draws):
    y = _argmax(row)
    return _match(y, children, proposal)


def descent_step(row, children, proposal, draws):
    y = draws.categorical(row)
    return _match(y, children, proposal)


def _match(y: int, children: list[int], proposal: Proposal) -> tuple[int | None, int | None]:
    for c in children:
        if proposal.draft_token_ids[c] == y:
            return c, None
    return None, y


def residual_distribution(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """norm(max(q - p, 0)) for one row [vocab_size]; q itself when that is empty (rounding only)."""
    r = (q - p).clamp_min(0.0)
    mass = r.sum()
    return r / mass if mass > 0 else q


def accept_prob(target: torch.Tensor, draft: torch.Tensor) -> float:
    """min(1, target / draft); 0 where that is NaN (a row its processing emptied), as `min` would
    have kept 1.0 and accepted the draft token that plain decoding never draws."""
    ratio = float(target / draft)
    return min(1.0, ratio) if ratio == ratio else 0.0


def rrs_step(row, children, proposal, draws):
    """Recursive rejection sampling over siblings drawn without replacement."""
    q = row.double().clone()
    p = proposal.draft_probs[children[0]].double().clone()  # [vocab_size] shared by the siblings
    for c in children:
        x = proposal.draft_token_ids[c]
        assert p[x] > 0, "a sibling was drawn with zero draft probability"
        if draws.bernoulli(accept_prob(q[x], p[x])):
            return c, None
        q = residual_distribution(q, p)
        p[x] = 0.0  # the next sibling was drawn from p without the earlier ones
        if p.sum() > 0:
            p = p / p.sum()
    return None, draws.categorical(q)


def kseq_beta(p: torch.Tensor, q: torch.Tensor, rho: float) -> float:
    """beta(rho) = sum_x min(p(x), q(x) / rho): one candidate's acceptance probability."""
    return float(torch.minimum(p, q / rho).sum())


def kseq_rho(p: torch.Tensor, q: torch.Tensor, k: int, iters: int = 48) -> float:
    """The smallest rho in [1, k] with 1 - (1 - beta(rho))^k <= rho * beta(rho) (bisection).

    The left side falls and the right side rises with rho; the bracket's upper end is returned so
    that the inequality (which keeps the residual nonnegative) always holds.
    """
    assert k >= 1
    # Host copies (a sync on GPU): the bisection is scalar work, cheapest in numpy.
    p_np, q_np = p.double().cpu().numpy(), q.double().cpu().numpy()

    def gap(rho: float) -> float:
        beta = float(np.minimum(p_np, q_np / rho).sum())
        return 1.0 - (1.0 - beta) ** k - rho * beta

    lo, hi = 1.0, float(k)
    if k == 1 or gap(lo) <= 0.0:
        return lo
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if gap(mid) <= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def kseq_residual(p: torch.Tensor, q: torch.Tensor, rho: float, k: int) -> torch.Tensor:
    """[vocab_size] the distribution of the recovered token when all k candidates are rejected:
    norm(q - min(p, q / rho) * (1 - (1 - beta)^k) / beta)."""
    p, q = p.double(), q.double()
    beta = kseq_beta(p, q, rho)
    scale = (1.0 - (1.0 - beta) ** k) / beta if beta > 0 else float(k)
    r = (q - torch.minimum(p, q / rho) * scale).clamp_min(0.0)
    return r / r.sum() if r.sum() > 0 else q


def kseq_step(row, children, proposal, draws):
    """K-SEQ over the candidates through this node, in a uniformly random order (their trie order
    depends on their values, and taking the first acceptance in such an order would be biased)."""
    q = row.double()
    p = proposal.draft_probs[children[0]].double()  # [vocab_size] shared by the candidates
    remaining = torch.tensor([proposal.counts[c] for c in children], dtype=torch.float64)  # [num_children]
    k = int(remaining.sum())
    rho = kseq_rho(p, q, k)
    while remaining.sum() > 0:
        j = draws.categorical(remaining)
        remaining[j] -= 1
        x = proposal.draft_token_ids[children[j]]
        if draws.bernoulli(accept_prob(q[x], rho * p[x])):
            return children[j], None
    return None, draws.categorical(kseq_residual(p, q, rho, k))


STEPS: dict[str, Step] = {"greedy": greedy_step, "descent": descent_step, "rrs": rrs_step, "kseq": kseq_step}


def verify_tree(rule: str, rows: torch.Tensor, proposal: Proposal, draws: Draws) -> VerifyResult:
    """One sequence. rows [num_nodes + 1, vocab_size]: target logits for greedy, processed target
    probabilities q otherwise."""
    check_rule(rule, proposal)
    if rule == "greedy":
        return walk(greedy_step, rows, proposal, draws, _argmax)
    return walk(STEPS[rule], rows, proposal, draws, draws.categorical)


def verify_trees(rule: str, rows: torch.Tensor, proposals: list[Proposal],
                 generators: Generators) -> list[VerifyResult]:
    """A ragged batch: sequence b owns rows [cu[b], cu[b + 1]) with cu[b + 1] - cu[b] = n_b + 1."""
    gens = generators if isinstance(generators, list) else [generators] * len(proposals)
    rows = rows.cpu()  # explicit host copy (a sync on GPU): the walk is per-node host work with CPU generators
    out, row0 = [], 0
    for proposal, gen in zip(proposals, gens, strict=True):
        n = proposal.num_draft_tokens + 1
        out.append(verify_tree(rule, rows[row0:row0 + n], proposal, GeneratorDraws(gen)))
        row0 += n
    assert row0 == rows.shape[0]
    return out
