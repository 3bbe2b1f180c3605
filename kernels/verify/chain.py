"""Chain verification rules over ragged batches (DESIGN §3).

Layout: sequence b drafted k_b tokens and brings k_b + 1 target rows (the target's distribution
after the pending token and after each draft token). Rows and draft tokens are flat, never padded:
sequence b owns draft tokens [cu_draft[b], cu_draft[b+1]) and rows [cu_draft[b] + b, cu_draft[b+1] + b].
"""

from __future__ import annotations

import torch

from specray.kernels.cpu_ops import argmax_rows
from specray.kernels.proposal import VerifyResult
from specray.kernels.sampling import Generators, sample_rows, uniforms


def draft_rows(cu_draft: list[int]) -> torch.Tensor:
    """[num_draft] target row that judges each draft token."""
    return torch.cat([torch.arange(cu_draft[b], cu_draft[b + 1]) + b for b in range(len(cu_draft) - 1)]
                     or [torch.empty(0, dtype=torch.long)])


def first_rejection(accept: torch.Tensor, cu_draft: list[int]) -> list[int]:
    """accept [num_draft] bool -> accepted count per sequence (index of its first rejection).

    One host sync, then a scan on the host: rounds bring a few draft tokens per sequence, where
    five small tensor ops cost more than the loop."""
    flags = accept.tolist()
    counts = []
    for b in range(len(cu_draft) - 1):
        start, end = cu_draft[b], cu_draft[b + 1]
        counts.append(next((j - start for j in range(start, end) if not flags[j]), end - start))
    return counts


def _results(draft_ids: list[int], cu_draft: list[int], num_accepted: list[int],
             next_ids: list[int]) -> list[VerifyResult]:
    out = []
    for b, (a, nxt) in enumerate(zip(num_accepted, next_ids, strict=True)):
        k = cu_draft[b + 1] - cu_draft[b]
        out.append(VerifyResult(draft_ids[cu_draft[b]:cu_draft[b] + a], nxt, a == k, k))
    return out


def verify_greedy(target_logits: torch.Tensor, draft_token_ids: torch.Tensor,
                  cu_draft: list[int]) -> list[VerifyResult]:
    """Greedy chain: keep the longest prefix where each draft token equals the target argmax at its
    parent; then emit the target argmax after it (recovered, or bonus after a full match).

    target_logits [num_rows, vocab_size]; draft_token_ids [num_draft].
    """
    argmax = argmax_rows(target_logits)  # [num_rows]
    if cu_draft[-1] == 0:  # no drafts (decoding without speculation): each row's argmax is the bonus
        return _results([], cu_draft, [0] * (len(cu_draft) - 1), argmax.tolist())
    draft_token_ids = draft_token_ids.to(target_logits.device)  # proposals arrive on the host
    accept = argmax[draft_rows(cu_draft)] == draft_token_ids
    num_accepted = first_rejection(accept, cu_draft)
    last_rows = torch.tensor([cu_draft[b] + b + a for b, a in enumerate(num_accepted)], dtype=torch.long)
    return _results(draft_token_ids.tolist(), cu_draft, num_accepted, argmax[last_rows].tolist())


def residual_distribution(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """norm(max(q - p, 0)) row-wise; [rows, vocab_size]. Falls back to q where q <= p everywhere
    (only reachable through rounding: a rejection has probability 0 then)."""
    residual = (q - p).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(1e-30), q)


def verify_speculative(target_probs: torch.Tensor, draft_token_ids: torch.Tensor, cu_draft: list[int],
                       draft_probs: torch.Tensor | None, generators: Generators) -> list[VerifyResult]:
    """Speculative sampling (chain): accept x with probability min(1, q(x)/p(x)); at the first
    rejection sample the recovered token from norm(max(q - p, 0)); after a full chain sample the
    bonus token from q.

    target_probs [num_rows, vocab_size] (processed q); draft_token_ids [num_draft];
    draft_probs [num_draft, vocab_size] (processed p), None for deterministic proposals (p = point mass).
    """
    device = target_probs.device  # proposals arrive on the host; verify where the target ran
    draft_token_ids = draft_token_ids.to(device)
    draft_probs = None if draft_probs is None else draft_probs.to(device)
    rows = draft_rows(cu_draft).to(device)
    q_x = target_probs[rows, draft_token_ids]  # [num_draft]
    p_x = torch.ones_like(q_x) if draft_probs is None else draft_probs[torch.arange(len(rows), device=device), draft_token_ids]
    counts = [cu_draft[b + 1] - cu_draft[b] for b in range(len(cu_draft) - 1)]
    u = uniforms(counts, generators, device=target_probs.device)  # [num_draft]
    num_accepted = first_rejection(u * p_x < q_x, cu_draft)
    last_rows = torch.tensor([cu_draft[b] + b + a for b, a in enumerate(num_accepted)], dtype=torch.long)
    dist = target_probs[last_rows]  # [batch, vocab_size]: bonus rows keep q
    rejected = [b for b, a in enumerate(num_accepted) if a < counts[b]]
    if rejected:
        at = torch.tensor([cu_draft[b] + num_accepted[b] for b in rejected], dtype=torch.long)
        p = (torch.nn.functional.one_hot(draft_token_ids[at], dist.shape[1]).to(dist.dtype)
             if draft_probs is None else draft_probs[at])
        idx = torch.tensor(rejected, dtype=torch.long)
        dist[idx] = residual_distribution(dist[idx], p)
    next_ids = sample_rows(dist, generators).tolist()
    return _results(draft_token_ids.tolist(), cu_draft, num_accepted, next_ids)
