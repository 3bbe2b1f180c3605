"""A draft model growing a tree per sequence (RSD-C, RSD-S, SpecTr, top-k), level by level.

Calibration and the root's distribution come from `DraftModelDrafter` (one chain step over the
committed tokens the draft lacks). Each further level runs the whole tree so far as one tree chunk
after the committed context (tree mask, positions = depth) and reads the frontier's rows; the
tree's KV is scratch: the draft cache's valid length stays at the committed tokens, so the next
round's calibration overwrites it. Greedy requests get the same shape, grown deterministically
(top-k per node), as a deterministic tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.draft_model import DraftModelDrafter
from specray.kernels.drafters.tree_shapes import (
    TreeBuild,
    TreeSpec,
    grow_beam,
    grow_rsd_c,
    grow_rsd_s,
    grow_spectr,
    grow_topk,
    keep_most_likely,
)
from specray.kernels.drafters.vocab_trim import VocabTrimDrafter
from specray.kernels.model import LlamaModel
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import processed_probs


@dataclass
class _Plan:
    """One request's tree this round."""

    build: TreeBuild
    depth: int
    width: int  # rsd_s beam width / spectr chain count after the budget
    budget: int | None


class TreeDraftModelDrafter:
    name = "draft_model"

    def __init__(self, model: LlamaModel, tree: TreeSpec, num_blocks: int = 2048, block_size: int = 16,
                 vocab_trim_ids: torch.Tensor | None = None, layer_groups=None, workers=None):
        # VocabTrim: every node's distribution is the softmax over the subset, as for chains.
        # Layer-parallel: the tree's levels run fuzzy; their KV is never committed, the root step is exact.
        self.base = (DraftModelDrafter(model, num_blocks, block_size, layer_groups, workers) if vocab_trim_ids is None
                     else VocabTrimDrafter(model, vocab_trim_ids, num_blocks, block_size, layer_groups, workers))
        self.tree = tree

    def release(self, seq_id: object) -> None:
        self.base.release(seq_id)

    def _root_logits(self, requests: list[DraftRequest]) -> torch.Tensor:
        """Calibrate every request -> the drafting ones' root distributions' logits [num drafting, vocab_size]."""
        return self.base._step([self.base._calibrate(r) for r in requests])

    def _context_len(self, seq_id: object) -> int:
        """Committed tokens in the draft cache: the tree chunk follows them."""
        return len(self.base.states[seq_id].fed)

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        logits = self._root_logits(requests)  # [num drafting, vocab_size]
        active = [i for i, r in enumerate(requests) if r.num_draft_tokens > 0]
        plans = {i: self._plan(requests[i]) for i in active}
        rows = {i: logits[j:j + 1] for j, i in enumerate(active)}  # root rows
        level = 0
        while active:
            for i in active:
                self._grow(requests[i], plans[i], rows[i], level)
            level += 1
            active = [i for i in active if level < plans[i].depth and plans[i].build.frontier]
            if active:
                rows = self._frontier_logits(requests, plans, active)
        return [self._finish(plans[i]) if i in plans else Proposal([]) for i in range(len(requests))]

    def _plan(self, r: DraftRequest) -> _Plan:
        tree, budget = self.tree, r.verify_budget
        depth = tree.depth(r.num_draft_tokens)
        width, depth = tree.shape(depth, budget) if tree.kind in ("rsd_s", "spectr") else (tree.width, depth)
        kind = "deterministic_tree" if r.sampling.greedy else tree.sampled_kind
        build = TreeBuild(kind)
        if kind == "iid":
            build.frontier_counts = [width]
        return _Plan(build, depth, width, budget)

    def _grow(self, r: DraftRequest, plan: _Plan, logits: torch.Tensor, level: int) -> None:
        """logits [len(frontier), vocab_size] -> the next level of the tree."""
        tree, build = self.tree, plan.build
        logits = logits.cpu()  # explicit host copy (a sync on GPU): growth is host bookkeeping, CPU generators
        if build.kind == "deterministic_tree":
            logp = (logits.float().log_softmax(-1) if r.sampling.greedy
                    else processed_probs(logits, [r.sampling] * logits.shape[0]).log())
            if tree.kind == "rsd_c":
                grow_topk(build, logp, tree.branching[level], None)
            elif tree.kind == "topk":
                grow_topk(build, logp, tree.k, tree.width)
            else:  # rsd_s / spectr shapes for greedy requests: a deterministic beam
                grow_beam(build, logp, plan.width)
            return
        p = processed_probs(logits, [r.sampling] * logits.shape[0])  # [len(frontier), vocab_size]
        if tree.kind == "rsd_c":
            grow_rsd_c(build, p, tree.branching[level], r.generator)
        elif tree.kind == "rsd_s":
            grow_rsd_s(build, p, plan.width, r.generator)
        else:
            grow_spectr(build, p, r.generator)

    def _frontier_logits(self, requests, plans, active) -> dict[int, torch.Tensor]:
        """One tree chunk per active sequence (the whole tree so far) -> each frontier's logits."""
        chunks = [self._tree_chunk(requests[i], plans[i].build) for i in active]
        logits = self._tree_logits(chunks)  # [sum(num_nodes), vocab_size]; valid lengths unchanged
        out, row0 = {}, 0
        for i, c in zip(active, chunks, strict=True):
            frontier = torch.tensor(plans[i].build.frontier, dtype=torch.long)
            out[i] = logits[row0 + frontier]
            row0 += len(c.token_ids)
        return out

    def _tree_chunk(self, r: DraftRequest, build: TreeBuild) -> SeqChunk:
        return SeqChunk(r.seq_id, list(build.tokens), self._context_len(r.seq_id), list(build.parents),
                        num_logits=len(build.tokens))

    def _tree_logits(self, chunks: list[SeqChunk]) -> torch.Tensor:
        base = self.base
        return base.logits(RaggedBatch.build(chunks, base.cache, base.model.embed_tokens.device), fuzzy=True)

    def _finish(self, plan: _Plan) -> Proposal:
        build = plan.build
        if build.kind == "deterministic_tree" and plan.budget is not None:
            build = keep_most_likely(build, plan.budget)
        if build.kind == "wor_tree" and plan.budget is not None:
            return build.proposal(limit=plan.budget)  # a level-order prefix is a tree
        assert plan.budget is None or len(build.tokens) <= plan.budget
        return build.proposal()
