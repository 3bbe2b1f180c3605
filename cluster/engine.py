"""In-process engine: continuous batching over a TargetWorker and an optional DraftWorker.

Each `step` is one round for every running sequence: the draft worker proposes (calibration for
the last round rides on the same call), then one ragged target pass prefills newly admitted
sequences and verifies everyone else's proposals. The distributed router places the same worker
classes on Ray; this engine runs them in-process.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from specray.actors.messages import DraftItem, TargetItem
from specray.cluster.outputs import RequestOutput, SpecMetrics
from specray.cluster.params import SamplingParams
from specray.cluster.sequence import Sequence
from specray.kernels.proposal import Proposal, VerifyResult


class TargetPool(Protocol):
    def step(self, items: list[TargetItem]) -> list[VerifyResult]: ...
    def release(self, seq_id: object) -> None: ...


class DraftPool(Protocol):
    def propose(self, items: list[DraftItem]) -> list[Proposal]: ...
    def release(self, seq_id: object) -> None: ...


@dataclass(frozen=True)
class EngineConfig:
    max_model_len: int
    vocab_size: int
    kv_capacity_tokens: int  # target KV slots; admission reserves a request's worst case
    block_size: int = 16
    max_num_seqs: int = 32
    num_speculative_tokens: int = 0  # 0 without a drafter
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        assert self.max_model_len >= 2 and self.max_num_seqs >= 1 and self.num_speculative_tokens >= 0


def engine_config(model_config, tokenizer, spec, max_model_len: int | None, max_num_seqs: int,
                  num_blocks: int, block_size: int) -> tuple[EngineConfig, set[int]]:
    """The engine's limits from the target's ModelConfig and the SpeculativeConfig (or None)."""
    limit = model_config.max_position_embeddings
    if max_model_len is not None and not 2 <= max_model_len <= limit:
        raise ValueError(f"max_model_len must be in [2, {limit}], got {max_model_len}")
    eos = set(model_config.eos_token_ids) or {tokenizer.eos_token_id}
    return EngineConfig(
        max_model_len=max_model_len or limit, vocab_size=model_config.vocab_size,
        kv_capacity_tokens=num_blocks * block_size, block_size=block_size, max_num_seqs=max_num_seqs,
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        disable_by_batch_size=spec.disable_by_batch_size if spec else None), eos


class DraftUnavailable(RuntimeError):
    """The draft pool cannot propose right now (a worker died or is restarting)."""


@dataclass
class EngineStats:
    """Wall time the engine spent waiting on each pool (benchmarks read it)."""

    steps: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    num_drafts: int = 0  # rounds in which a sequence had draft tokens verified
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [max k] acceptances at draft position i

    def record_round(self, res: VerifyResult) -> None:
        if res.num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += res.num_draft_tokens
        self.num_accepted_tokens += res.num_accepted
        self.accepted_per_pos.extend([0] * (res.num_draft_tokens - len(self.accepted_per_pos)))
        for pos in range(res.num_accepted):
            self.accepted_per_pos[pos] += 1


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]


class Engine:
    def __init__(self, target: TargetPool, draft: DraftPool | None, tokenizer, eos_token_ids,
                 config: EngineConfig):
        self.target, self.draft, self.tokenizer, self.config = target, draft, tokenizer, config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.requests: dict[str, _Request] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.reserved_tokens = 0
        self.stats = EngineStats()
        self._ids = itertools.count()

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None = None,
                    request_id: str | None = None) -> str:
        """Validate and queue a request; a bad one raises ValueError and touches nothing else."""
        self.check_prompt(prompt_token_ids, params)
        request_id = request_id or str(next(self._ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        seqs = [Sequence(f"{request_id}/{i}", request_id, i, list(prompt_token_ids), params,
                         self.eos_token_ids, self.config.max_model_len) for i in range(params.n)]
        self.requests[request_id] = _Request(request_id, prompt, list(prompt_token_ids), seqs)
        self.waiting.extend(seqs)
        return request_id

    def check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"expected SamplingParams, got {type(params).__name__}")
        if not prompt_token_ids:
            raise ValueError("prompt is empty: it must contain at least one token")
        if len(prompt_token_ids) >= self.config.max_model_len:
            raise ValueError(f"prompt has {len(prompt_token_ids)} tokens; the model's context is "
                             f"{self.config.max_model_len} tokens, leaving no room to generate")
        if self._reservation(len(prompt_token_ids), params) > self.config.kv_capacity_tokens:
            raise ValueError("request can never fit in the KV cache; lower max_tokens or raise the cache size")
        if any(not isinstance(t, int) or not 0 <= t < self.config.vocab_size for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.config.vocab_size})")

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if seq in self.waiting:
                self.waiting.remove(seq)
            if seq in self.running:
                self._retire(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling -------------------------------------------------------------------------
    def _reservation(self, prompt_len: int, params: SamplingParams) -> int:
        tokens = min(prompt_len + params.max_tokens, self.config.max_model_len) + self.config.num_speculative_tokens + 1
        bs = self.config.block_size
        return -(-tokens // bs) * bs

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            need = self._reservation(len(seq.prompt_token_ids), seq.params)
            if self.reserved_tokens + need > self.config.kv_capacity_tokens:
                break
            self.waiting.popleft()
            self.reserved_tokens += need
            self.running.append(seq)

    def _num_draft_tokens(self, seq: Sequence) -> int:
        if self.draft is None:
            return 0
        k = seq.params.num_speculative_tokens
        k = self.config.num_speculative_tokens if k is None else k
        limit = self.config.disable_by_batch_size
        if limit is not None and len(self.running) >= limit:
            k = 0
        return min(k, seq.max_draft_tokens())

    # -- the round --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one round for every running sequence; returns the requests that changed."""
        self._admit()
        if not self.running:
            return []
        decoding = [s for s in self.running if s.output_token_ids]
        start = time.perf_counter()
        proposals = self._propose(decoding)
        drafted = time.perf_counter()
        items = []
        for seq in self.running:
            if seq.output_token_ids:
                items.append(TargetItem(seq.seq_id, seq.output_token_ids[-1:], proposals[seq.seq_id]))
            else:
                items.append(TargetItem(seq.seq_id, list(seq.prompt_token_ids), Proposal([]), seq.spec()))
        results = self.target.step(items)
        self.stats.steps += 1
        self.stats.draft_seconds += drafted - start
        self.stats.target_seconds += time.perf_counter() - drafted
        touched = []
        for seq, res in zip(list(self.running), results, strict=True):
            self._commit(seq, res)
            touched.append(seq)
        return self._outputs(touched)

    def _propose(self, decoding: list[Sequence]) -> dict[str, Proposal]:
        proposals = {s.seq_id: Proposal([]) for s in decoding}
        if self.draft is None or not decoding:
            return proposals
        items = []
        for seq in decoding:
            delta = seq.token_ids[seq.draft_sent:]
            items.append(DraftItem(seq.seq_id, delta, self._num_draft_tokens(seq),
                                   seq.spec() if seq.draft_sent == 0 else None))
            seq.draft_sent = seq.num_tokens
        try:
            drafted = self.draft.propose(items)
        except DraftUnavailable:
            # Target-only decoding this round; the draft side is rebuilt from the full history
            # (prompt, committed tokens, sampling spec) once it answers again.
            for seq in self.running:
                seq.draft_sent = 0
            return proposals
        for seq, proposal in zip(decoding, drafted, strict=True):
            proposals[seq.seq_id] = proposal
        return proposals

    def _commit(self, seq: Sequence, res: VerifyResult) -> None:
        if seq.output_token_ids:  # a decode round (the prefill's first token is not one)
            self.stats.record_round(res)
            m = seq.metrics
            m.num_rounds += 1
            m.num_draft_tokens += res.num_draft_tokens
            m.num_accepted_tokens += res.num_accepted
            m.num_emitted_tokens += len(res.emitted_token_ids)
        seq.append(res.emitted_token_ids, res.logprobs)
        seq.detokenize(self.tokenizer)
        if seq.finished:
            self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.reserved_tokens -= self._reservation(len(seq.prompt_token_ids), seq.params)
        self.target.release(seq.seq_id)
        if self.draft is not None and seq.draft_sent:
            self.draft.release(seq.seq_id)

    def _outputs(self, seqs: list[Sequence]) -> list[RequestOutput]:
        out = []
        for request_id in dict.fromkeys(s.request_id for s in seqs):
            req = self.requests[request_id]
            finished = all(s.finished for s in req.seqs)
            out.append(RequestOutput(request_id, req.prompt, req.prompt_token_ids,
                                     [s.completion() for s in req.seqs], finished, _merged_metrics(req.seqs)))
            if finished:
                del self.requests[request_id]
        return out


def _merged_metrics(seqs: list[Sequence]) -> SpecMetrics:
    m = SpecMetrics()
    for s in seqs:
        m.num_rounds += s.metrics.num_rounds
        m.num_draft_tokens += s.metrics.num_draft_tokens
        m.num_accepted_tokens += s.metrics.num_accepted_tokens
        m.num_emitted_tokens += s.metrics.num_emitted_tokens
    return m
