"""Batched diffusion decoding: every running sequence's drafts in one model call a round.

The engine keeps each sequence's canvas, step and scores (the logits of its current canvas), so a
round ships nothing but token ids out: finalized blocks as they complete.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specray.kernels.diffusion.budget import CallCost, ChainOdds, best_num_drafts
from specray.kernels.diffusion.decoding import (
    CanvasPlan,
    DecodeOptions,
    Scores,
    StepSampler,
    initial_canvas,
    masked_positions,
)
from specray.kernels.diffusion.freedave import accept, build_drafts
from specray.kernels.diffusion.model import DiffusionModel
from specray.kernels.sampling import SamplingConfig


@dataclass
class DiffusionSeq:
    seq_id: object
    plan: CanvasPlan
    sampler: StepSampler
    canvas: torch.Tensor  # [length] the static state at `step`
    stop_token_ids: frozenset[int]  # a finalized block holding one ends decoding
    step: int = 0
    scores: Scores | None = None  # of `canvas`; None before its first forward
    emitted_blocks: int = 0
    done: bool = False
    chain: ChainOdds = field(default_factory=ChainOdds)  # how far its chains reach (adaptive drafts)

    def __post_init__(self) -> None:
        assert self.canvas.shape == (self.plan.length,)


@dataclass
class DiffusionUpdate:
    """One sequence's outcome of a round."""

    seq_id: object
    token_ids: list[int]  # newly finalized blocks, in order
    steps: int  # static steps this round advanced (0 for the first forward)
    drafts: int  # drafts built this round (FreeDave's K, fewer near the end; 0 for the first forward)
    forwarded: int  # canvases of this sequence the round's model call scored (0: no call was needed)
    done: bool  # the canvas is complete, or a finalized block holds a stop token


@dataclass
class DiffusionMetrics:
    model_calls: int = 0
    steps: int = 0  # static steps advanced
    canvases: int = 0  # canvases forwarded (drafts included)
    per_seq_calls: dict = field(default_factory=dict)


class DiffusionEngine:
    def __init__(self, model: DiffusionModel, options: DecodeOptions):
        self.model, self.options = model, options
        self.mask_token_id = model.config.mask_token_id
        self.seqs: dict[object, DiffusionSeq] = {}
        self.metrics = DiffusionMetrics()
        self.cost = CallCost()  # what a call costs, for adaptive drafts

    def num_drafts(self, s: DiffusionSeq, batch: int) -> int:
        """This round's drafts for `s`: num_drafts, or with `adaptive` the budget's pick."""
        if not self.options.adaptive or self.options.num_drafts == 1:
            return self.options.num_drafts
        if not self.cost.separable():  # explore: calls of another size let the fit split the cost
            return 2
        fixed, per_token = self.cost.fit()
        return best_num_drafts(s.chain.odds, fixed / batch, per_token * s.plan.length, self.options.num_drafts)

    def add(self, seq_id: object, prompt_ids: list[int], plan: CanvasPlan, sampler: StepSampler,
            stop_token_ids: frozenset[int] = frozenset()) -> None:
        assert seq_id not in self.seqs, f"sequence {seq_id!r} is already running"
        assert plan.length <= self.model.max_len
        canvas = initial_canvas(prompt_ids, plan, self.mask_token_id)
        self.seqs[seq_id] = DiffusionSeq(seq_id, plan, sampler, canvas, frozenset(stop_token_ids))

    def release(self, seq_id: object) -> None:
        self.seqs.pop(seq_id, None)
        self.metrics.per_seq_calls.pop(seq_id, None)

    def step(self, seq_ids: list[object] | None = None) -> list[DiffusionUpdate]:
        """One model call for the given running sequences (default: all of them). No sequence
        changes until every one's outcome is known: a call that raises leaves the canvases as they
        were, so the caller can retry its sequences one at a time."""
        seqs = [self.seqs[i] for i in (list(self.seqs) if seq_ids is None else seq_ids)]
        seqs = [s for s in seqs if not s.done]
        if not seqs:
            return []
        k = self.options.num_drafts  # scores cover the steps of the most drafts a round may build
        drafts = {s.seq_id: [] if s.scores is None else build_drafts(
            s.canvas, s.scores, s.plan, s.step, self.num_drafts(s, len(seqs)), self.mask_token_id) for s in seqs}
        canvases, windows, owners = [], [], []
        for s in seqs:
            states = [(s.canvas, s.step)] if s.scores is None else \
                [(d, s.step + j + 1) for j, d in enumerate(drafts[s.seq_id])]
            for canvas, at in states:
                if at < s.plan.num_steps:  # the final canvas needs no logits
                    canvases.append(canvas)
                    windows.append(masked_positions(canvas, s.plan.window(at, k), self.mask_token_id))
                    owners.append(s.seq_id)
        start = time.perf_counter()
        logits = self.model.forward(canvases, windows) if canvases else []
        if canvases:
            self.cost.record(sum(int(c.shape[0]) for c in canvases), time.perf_counter() - start)
        scored: dict[object, list[Scores]] = {s.seq_id: [] for s in seqs}
        for owner, window, rows in zip(owners, windows, logits):
            scored[owner].append(Scores(rows, window, self.seqs[owner].sampler))
        accepted = {s.seq_id: self._accepted(s, drafts[s.seq_id], scored[s.seq_id]) for s in seqs}
        self.metrics.model_calls += 1 if canvases else 0
        self.metrics.canvases += len(canvases)
        return [self._advance(s, drafts[s.seq_id], scored[s.seq_id], accepted[s.seq_id]) for s in seqs]

    def _accepted(self, s: DiffusionSeq, drafts: list[torch.Tensor], scores: list[Scores]) -> int:
        """Static steps the call advances `s` (0 on its first forward); changes nothing."""
        if not drafts:
            return 0
        return accept(drafts, scores + [None] * (len(drafts) - len(scores)), s.plan, s.step, self.mask_token_id)

    def _advance(self, s: DiffusionSeq, drafts: list[torch.Tensor], scores: list[Scores], best: int) -> DiffusionUpdate:
        if scores:  # this sequence took part in the call
            self.metrics.per_seq_calls[s.seq_id] = self.metrics.per_seq_calls.get(s.seq_id, 0) + 1
        if not drafts:  # the first forward: scores of the initial canvas
            s.scores = scores[0]
            return DiffusionUpdate(s.seq_id, [], 0, 0, len(scores), False)
        s.chain.record(len(drafts), best)
        s.canvas, s.step = drafts[best - 1], s.step + best
        s.scores = scores[best - 1] if best - 1 < len(scores) else None
        self.metrics.steps += best
        tokens = self._finalized(s)
        return DiffusionUpdate(s.seq_id, tokens, best, len(drafts), len(scores), s.done)

    def _finalized(self, s: DiffusionSeq) -> list[int]:
        blocks = s.plan.finalized_blocks(s.step)
        a = s.plan.prompt_len + s.emitted_blocks * s.plan.block_length
        b = s.plan.prompt_len + blocks * s.plan.block_length
        s.emitted_blocks = blocks
        tokens = s.canvas[a:b].tolist()
        s.done = s.step == s.plan.num_steps or any(t in s.stop_token_ids for t in tokens)
        return tokens


def decode_greedy(model: DiffusionModel, prompts: list[list[int]], max_tokens: int, options: DecodeOptions,
                  eos: frozenset[int]) -> tuple[list[list[int]], DiffusionMetrics]:
    """All prompts in one running batch, greedy, to the end -> (each one's tokens, cut after its
    first EOS and at max_tokens; the engine's metrics). Benchmarks and training evaluations use it."""
    engine = DiffusionEngine(model, options)
    sampler = StepSampler(SamplingConfig(0.0), 0, model.config.mask_token_id)
    for i, p in enumerate(prompts):
        engine.add(i, p, CanvasPlan.for_request(len(p), max_tokens, options), sampler, eos)
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    while any(not s.done for s in engine.seqs.values()):
        for u in engine.step():
            out[u.seq_id] += u.token_ids
    cut = [next((j + 1 for j, t in enumerate(ids) if t in eos), len(ids)) for ids in out.values()]
    return [out[i][:min(c, max_tokens)] for i, c in enumerate(cut)], engine.metrics

