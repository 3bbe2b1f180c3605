"""Verify a ragged batch: sequences grouped by (rule, shape), each group in one call of its rule.

Chains go through the vectorised chain rules (kernels/verify/chain.py), trees through the tree walk
(kernels/verify/tree.py). Sequence b owns target rows [cu[b], cu[b + 1]) with n_b + 1 rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specray.kernels.penalties import RowHistory, apply_bad_words, apply_min_tokens, apply_penalties
from specray.kernels.proposal import Proposal, VerifyResult
from specray.kernels.sampling import SamplingConfig, apply_logit_bias, processed_probs
from specray.kernels.verify.chain import verify_greedy, verify_speculative
from specray.kernels.verify.tree import verify_trees


class Group(NamedTuple):
    rule: str  # kernels/verify/rules.py RULES
    shape: str  # "tree", "dense" (a chain with draft_probs) or "point" (a deterministic chain)


def shape_of(proposal: Proposal) -> str:
    return "tree" if proposal.is_tree else ("dense" if proposal.draft_probs is not None else "point")


def verify_batch(logits: torch.Tensor, proposals: list[Proposal], rules: list[str],
                 samplings: list[SamplingConfig], generators: list[torch.Generator | None],
                 histories: list[list[RowHistory] | None] | None = None) -> list[VerifyResult]:
    """logits [sum(n_b + 1), vocab_size] -> one VerifyResult per sequence, in order. Every rule sees
    the rows as their sequence's sampling processes them: allowed_token_ids and logit_bias, then the
    penalties, bad_words and min_tokens (`histories`: a sequence's rows' RowHistory, where its
    sampling reads it). The target distribution is that one."""
    if any(s.processes_rows for s in samplings):
        logits = _processed_rows(logits, proposals, samplings, histories)
    bounds = _row_bounds(proposals)
    groups: dict[Group, list[int]] = {}
    for b, (proposal, rule) in enumerate(zip(proposals, rules, strict=True)):
        groups.setdefault(Group(rule, shape_of(proposal)), []).append(b)
    results: list[VerifyResult | None] = [None] * len(proposals)
    for group, members in groups.items():
        whole = len(members) == len(proposals)  # one group (the usual case): every row, in order
        rows = logits if whole else logits[torch.cat([torch.arange(*bounds[b]) for b in members])]
        out = _verify_group(group, rows, [proposals[b] for b in members], [samplings[b] for b in members],
                            [generators[b] for b in members])
        for b, res in zip(members, out, strict=True):
            results[b] = res
    return results  # type: ignore[return-value]


def _processed_rows(logits: torch.Tensor, proposals: list[Proposal], samplings: list[SamplingConfig],
                    histories: list[list[RowHistory] | None] | None) -> torch.Tensor:
    configs = [s for d, s in zip(proposals, samplings, strict=True) for _ in range(d.num_draft_tokens + 1)]
    logits = apply_logit_bias(logits, configs)
    if not any(s.reads_history for s in samplings):
        return logits
    assert histories is not None, "a penalised sequence's rows need their histories"
    rows = [h for d, hs in zip(proposals, histories, strict=True)
            for h in (hs if hs is not None else [None] * (d.num_draft_tokens + 1))]
    logits = apply_bad_words(apply_penalties(logits, configs, rows), configs, rows)
    return apply_min_tokens(logits, configs, rows)


def _verify_group(group: Group, logits: torch.Tensor, drafts: list[Proposal], samplings: list[SamplingConfig],
                  gens: list[torch.Generator | None]) -> list[VerifyResult]:
    if group.rule == "greedy":
        if group.shape == "tree":
            return verify_trees("greedy", logits, drafts, gens)
        return verify_greedy(logits, _draft_ids(drafts), _cu(drafts))
    configs = [s for d, s in zip(drafts, samplings) for _ in range(d.num_draft_tokens + 1)]
    q = processed_probs(logits, configs)  # [rows, vocab_size]
    if group.shape == "tree":
        return verify_trees(group.rule, q, drafts, gens)
    p = torch.cat([d.draft_probs for d in drafts]) if group.shape == "dense" else None  # [num_draft, vocab_size]
    return verify_speculative(q, _draft_ids(drafts), _cu(drafts), p, gens)


def _row_bounds(proposals: list[Proposal]) -> list[tuple[int, int]]:
    out, row0 = [], 0
    for d in proposals:
        out.append((row0, row0 + d.num_draft_tokens + 1))
        row0 += d.num_draft_tokens + 1
    return out


def _draft_ids(drafts: list[Proposal]) -> torch.Tensor:
    return torch.tensor([t for d in drafts for t in d.draft_token_ids], dtype=torch.long)  # [num_draft]


def _cu(drafts: list[Proposal]) -> list[int]:
    cu = [0]
    for d in drafts:
        cu.append(cu[-1] + d.num_draft_tokens)
    return cu
