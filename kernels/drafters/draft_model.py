"""A smaller Llama-family model drafting chains, with its own paged KV cache.

Calibration: at each propose the drafter compares the tokens whose KV it holds with the committed
tokens, drops the KV of rejected drafts (a length update) and feeds the committed tokens it lacks
(accepted drafts it never fed, plus the recovered or bonus token). That feed is the first draft
step of the round, so calibration costs no extra forward pass.

Layer-parallel drafting (EasySpec, kernels/layer_parallel.py): the round's later draft steps run the
fuzzy forward, whose KV is approximate; calibration then drops it all (accepted drafts included) and
the exact first step rewrites it from the committed tokens (bonus calibration).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.cpu_ops import argmax_rows
from specray.kernels.drafters.base import DraftRequest
from specray.kernels.layer_parallel import FuzzyForward, LayerGroups
from specray.kernels.tp_group import TPGroup
from specray.kernels.model import LlamaModel
from specray.kernels.proposal import Proposal
from specray.kernels.sampling import processed_probs, sample_rows


@dataclass
class DraftTimes:
    """Seconds in exact steps (each round's first: calibration and the first draft token) and in
    fuzzy (layer-parallel) steps; benchmarks read them."""

    exact_seconds: float = 0.0
    exact_steps: int = 0
    fuzzy_seconds: float = 0.0
    fuzzy_steps: int = 0


@dataclass
class _DraftState:
    fed: list[int] = field(default_factory=list)  # tokens whose KV the draft cache holds
    exact: int = 0  # fed[:exact] have exact KV (a sequential pass); the rest came from fuzzy steps


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelDrafter:
    name = "draft_model"

    def __init__(self, model: LlamaModel, num_blocks: int = 2048, block_size: int = 16,
                 layer_groups: LayerGroups | None = None, workers: TPGroup | None = None):
        self.model = model
        self.cache = model.make_cache(num_blocks, block_size)
        self.states: dict[object, _DraftState] = {}
        fuzzy = layer_groups is not None and layer_groups.size > 1  # N = 1 is ordinary drafting
        self.fuzzy = FuzzyForward(model, layer_groups, workers) if fuzzy else None
        self.calibrate_fuzzy_kv = True  # False only to measure what bonus calibration prevents
        self.times = DraftTimes()

    def _calibrate(self, r: DraftRequest) -> SeqChunk:
        """Drop rejected (and fuzzy) KV and return the committed tokens the draft cache lacks."""
        state = self.states.setdefault(r.seq_id, _DraftState())
        keep = min(common_prefix(state.fed, r.token_ids), len(r.token_ids) - 1)
        if self.calibrate_fuzzy_kv:
            keep = min(keep, state.exact)
        del state.fed[keep:]
        if r.seq_id in self.cache.tables:
            self.cache.set_cached(r.seq_id, keep)
        return SeqChunk(r.seq_id, r.token_ids[keep:], keep, num_logits=1 if r.num_draft_tokens else 0)

    def forward(self, batch: RaggedBatch, fuzzy: bool = False) -> torch.Tensor:
        """The model's logits over the draft cache: the fuzzy forward where asked and configured."""
        return (self.fuzzy if fuzzy and self.fuzzy is not None else self.model)(batch, self.cache)

    def logits(self, batch: RaggedBatch, fuzzy: bool = False) -> torch.Tensor:
        """The draft's [num_logits, vocab_size] logits for a batch over its cache (VocabTrim: -inf
        off the subset)."""
        return self.forward(batch, fuzzy)

    def proposal_logits(self, batch: RaggedBatch, fuzzy: bool = False) -> torch.Tensor:
        """The logits a chain's `_draw` reads (VocabTrim: over its kept ids alone)."""
        return self.logits(batch, fuzzy)

    def _draw(self, requests: list[DraftRequest], active: list[int], logits: torch.Tensor,
              drafts: list[list[int]], probs: list[list[torch.Tensor]]) -> None:
        sample_step(requests, active, logits, drafts, probs)

    def _step(self, chunks: list[SeqChunk], fuzzy: bool = False, proposal: bool = False) -> torch.Tensor:
        """A forward over the chunks, kept in the draft cache -> `logits` (`proposal`: `proposal_logits`)."""
        start = time.perf_counter()
        batch = RaggedBatch.build(chunks, self.cache, self.model.embed_tokens.device)
        logits = (self.proposal_logits if proposal else self.logits)(batch, fuzzy)
        fuzzy = fuzzy and self.fuzzy is not None
        self._record(fuzzy, time.perf_counter() - start)
        for c in chunks:
            self.cache.set_cached(c.seq_id, c.context_len + len(c.token_ids))
            state = self.states[c.seq_id]
            state.fed.extend(c.token_ids)
            if not fuzzy:
                state.exact = len(state.fed)
        return logits  # [num_logits, vocab_size]

    def _record(self, fuzzy: bool, seconds: float) -> None:
        t = self.times
        if fuzzy:
            t.fuzzy_seconds, t.fuzzy_steps = t.fuzzy_seconds + seconds, t.fuzzy_steps + 1
        else:
            t.exact_seconds, t.exact_steps = t.exact_seconds + seconds, t.exact_steps + 1

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        chunks = [self._calibrate(r) for r in requests]
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        active = list(range(len(requests)))
        logits = self._step(chunks, proposal=True)
        active = [i for i in active if requests[i].num_draft_tokens > 0]
        while active:
            self._draw(requests, active, logits, drafts, probs)
            active = [i for i in active if len(drafts[i]) < requests[i].num_draft_tokens]
            if not active:
                break
            step = [SeqChunk(requests[i].seq_id, drafts[i][-1:], len(self.states[requests[i].seq_id].fed))
                    for i in active]
            logits = self._step(step, fuzzy=True, proposal=True)
        return [Proposal(d, None if r.sampling.greedy or not p else torch.stack(p))
                for d, p, r in zip(drafts, probs, requests, strict=True)]

    def release(self, seq_id: object) -> None:
        self.states.pop(seq_id, None)
        self.cache.free(seq_id)


def sample_step(requests: list[DraftRequest], active: list[int], logits: torch.Tensor,
                drafts: list[list[int]], probs: list[list[torch.Tensor]]) -> None:
    """Draw the next draft token of each active request from logits [len(active), vocab_size]
    (row j is request active[j]); sampled requests also keep the row's proposal distribution."""
    configs = [requests[i].sampling for i in active]
    if all(c.greedy for c in configs):
        tokens = argmax_rows(logits).tolist()
    else:
        p = processed_probs(logits, configs)  # [len(active), vocab_size]
        tokens = sample_rows(p, [requests[i].generator for i in active]).tolist()
        for row, i in enumerate(active):
            probs[i].append(p[row])
    for row, i in enumerate(active):
        drafts[i].append(tokens[row])
