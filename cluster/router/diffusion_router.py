"""Continuous batching for a diffusion LM, with the Router's surface (add_request, step, abort, ...).

Every step is one model call over every running sequence (FreeDave's drafts included). A sequence
emits tokens a block at a time, when the block is finalized; EOS, stop tokens, stop strings and
max_tokens apply to those tokens as they do to an autoregressive model's. The canvas holds
max_tokens rounded up to whole blocks, cut (as an autoregressive sequence stops at the context) to
the whole blocks the model's length leaves beside the prompt; a prompt that leaves none is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from specray.actors.diffusion_worker import DiffusionItem
from specray.cluster.outputs import RequestOutput
from specray.cluster.params import SamplingParams, check_param, choice_seed
from specray.cluster.pools.api import DiffusionPool, TargetUnavailable
from specray.cluster.router.limits import RouterStats
from specray.cluster.router.requests import RequestBook
from specray.cluster.router.sequence import Sequence
from specray.kernels.diffusion.engine import DiffusionUpdate


@dataclass(frozen=True)
class DiffusionLimits:
    max_model_len: int  # prompt + canvas at most
    vocab_size: int
    block_length: int
    max_num_seqs: int = 32

    def __post_init__(self) -> None:
        assert self.max_model_len >= 2 and self.block_length >= 1 and self.max_num_seqs >= 1

    def room(self, prompt_len: int) -> int:
        """Tokens a canvas may hold beside a prompt: the whole blocks that fit the model's length."""
        return max(0, self.max_model_len - prompt_len) // self.block_length * self.block_length

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams, has_tokenizer: bool = True) -> None:
        """ValueError for a request a diffusion LM cannot run, naming what does not apply (and the
        request field: an OpenAI error body's `param`)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"expected SamplingParams, got {type(params).__name__}")
        params.check()  # again: a field may have changed since it was built
        check_param(bool(prompt_token_ids), "prompt", "prompt is empty: it must contain at least one token")
        check_param(all(type(t) is int and 0 <= t < self.vocab_size for t in prompt_token_ids), "prompt",
                    f"prompt token ids must be integers in [0, {self.vocab_size})")
        check_param(self.room(len(prompt_token_ids)) > 0, "prompt",
                    f"prompt has {len(prompt_token_ids)} tokens; the model's length {self.max_model_len} leaves no "
                    f"room for a block of {self.block_length} to generate")
        check_param(params.logprobs is None, "logprobs", "logprobs are not defined for a diffusion LM in specray "
                    "(tokens are not generated left to right from one distribution each)")
        check_param(params.max_tokens is not None, "max_tokens",
                    "max_tokens=None would make a diffusion LM's canvas the whole context (every step a forward "
                    "over all of it): give max_tokens")
        check_param(params.prompt_logprobs is None, "prompt_logprobs",
                    "prompt_logprobs are not defined for a diffusion LM (it does not predict a prompt left to right)")
        check_param(params.num_speculative_tokens is None and params.verify_budget is None,
                    "num_speculative_tokens" if params.num_speculative_tokens is not None else "verify_budget",
                    "num_speculative_tokens and verify_budget do not apply to a diffusion LM: FreeDave's drafts "
                    "are set by speculative_config['num_drafts']")
        processing = [name for name in ("logit_bias", "min_p", "presence_penalty", "frequency_penalty", "min_tokens",
                                        "allowed_token_ids", "bad_words")
                      if getattr(params, name)] + (["repetition_penalty"] if params.repetition_penalty != 1 else [])
        check_param(not processing, processing[0] if processing else None,
                    f"{', '.join(processing)}: not implemented for a diffusion LM in specray (the target-side "
                    "sampling options)")
        check_param(has_tokenizer or not params.stop, "stop",
                    "stop strings need a tokenizer, and this engine has none; use stop_token_ids")
        check_param(params.n <= self.max_num_seqs, "n", f"n={params.n} exceeds max_num_seqs {self.max_num_seqs}")
        check_param(all(t < self.vocab_size for t in params.stop_token_ids), "stop_token_ids",
                    f"stop_token_ids must be in [0, {self.vocab_size})")


class _CallFailed(Exception):
    """A model call raised inside the worker (its cause); the worker changed nothing."""


@dataclass
class DiffusionStats(RouterStats):
    model_calls: int = 0
    diffusion_steps: int = 0  # static steps advanced, all sequences
    tokens: int = 0  # tokens emitted


class DiffusionRouter(RequestBook):
    def __init__(self, pool: DiffusionPool, tokenizer, eos_token_ids, limits: DiffusionLimits):
        super().__init__(tokenizer, eos_token_ids, limits)
        self.target, self.draft = pool, None
        self.started: set[str] = set()  # sequences the pool holds
        self.stats = DiffusionStats()

    def _forget_running(self) -> None:
        self.running, self.started = [], set()

    def _item(self, seq: Sequence) -> DiffusionItem:
        p = seq.params
        seed = choice_seed(p.seed, seq.index)
        stops = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos_token_ids)
        canvas = min(p.max_tokens, self.config.room(len(seq.prompt_token_ids)))  # finishes "length" there
        return DiffusionItem(seq.seq_id, seq.prompt_token_ids, canvas, p.sampling_config(), seed, stops)

    def step(self) -> list[RequestOutput]:
        """One model call for every running sequence (newly admitted ones start with it)."""
        self.stats.steps += 1
        new = []
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.popleft()
            self.running.append(seq)
            new.append(self._item(seq))
        if not self.running:
            return []
        group = list(self.running)
        try:  # a lost worker's TargetUnavailable goes to the caller, which fails what ran
            changed = self._call(group, new)
        except _CallFailed as failed:
            changed = self._isolate(group, {item.seq_id: item for item in new}, failed.__cause__)
        return self.outputs(changed)  # a call that finalised no token of a request has nothing to stream

    def _call(self, group: list[Sequence], new: list[DiffusionItem]) -> list[Sequence]:
        """One model call for `group`, starting `new`; -> the sequences with news. _CallFailed: the
        worker raised and changed nothing (an error committing the updates is the router's own)."""
        self.started |= {item.seq_id for item in new}  # the worker holds them once the call starts
        try:
            updates = self.target.submit_step(new, [s.seq_id for s in group]).result()
        except TargetUnavailable:
            raise
        except Exception as error:  # noqa: BLE001
            self.started -= {item.seq_id for item in new}  # a call that raised holds none of them
            raise _CallFailed() from error
        self.stats.model_calls += any(u.forwarded for u in updates)  # a call that only finished canvases ran none
        by_id = {s.seq_id: s for s in group}
        return [by_id[u.seq_id] for u in updates if self._commit(by_id[u.seq_id], u)]

    def _isolate(self, group: list[Sequence], new: dict[object, DiffusionItem], error: Exception) -> list[Sequence]:
        """Retry a failed call one sequence at a time, so only the request that breaks it fails."""
        if len(group) == 1:
            self.fail_request(group[0].request_id, error)
            return []
        changed = []
        for seq in group:
            if seq not in self.running:  # a sibling choice failed
                continue
            item = new.get(seq.seq_id)
            try:
                changed += self._call([seq], [item] if item is not None else [])
            except _CallFailed as failed:
                self.fail_request(seq.request_id, failed.__cause__)
        return changed

    def _commit(self, seq: Sequence, update: DiffusionUpdate) -> bool:
        """Apply a call's update; True when the sequence has news: tokens, or its end."""
        m, drafted, accepted = seq.metrics, max(update.drafts - 1, 0), max(update.steps - 1, 0)
        m.num_rounds += 1 if update.forwarded else 0  # model calls this sequence took part in
        m.num_draft_tokens += drafted  # drafts beyond the first (the static state)
        m.num_accepted_tokens += accepted  # steps beyond the first a call advanced
        # the served counters (specray_spec_decode_*) as the request's usage counts them
        self.stats.num_drafts += drafted > 0
        self.stats.num_draft_tokens += drafted
        self.stats.num_accepted_tokens += accepted
        m.num_diffusion_steps += update.steps
        self.stats.diffusion_steps += update.steps
        emitted = seq.commit(update.token_ids, None, self.tokenizer) if update.token_ids else 0
        m.num_emitted_tokens += emitted  # what the output keeps: a stop string cuts the block it ends in
        self.stats.tokens += emitted
        if update.done and not seq.finished:  # the canvas is complete: max_tokens reached
            seq.finish_reason = "length"
        if seq.finished:
            self._retire(seq)
        return bool(update.token_ids) or seq.finished

    def _retire(self, seq: Sequence) -> None:
        self.running.remove(seq)
        if seq.seq_id in self.started:
            self.started.discard(seq.seq_id)
            self.target.release(seq.seq_id)


def diffusion_limits(config, block_length: int, max_model_len: int | None, max_num_seqs: int) -> DiffusionLimits:
    """Read from the model's config alone: callers check them before the weights load."""
    limit = config.model.max_position_embeddings
    if max_model_len is not None and not 2 <= max_model_len <= limit:
        raise ValueError(f"max_model_len must be in [2, {limit}], got {max_model_len}")
    context = max_model_len or limit
    if block_length > context - 1:  # a prompt token and one block: else every request is refused
        raise ValueError(f"block_length {block_length} leaves no room for a prompt in the context of {context} "
                         "tokens (max_model_len): at most max_model_len - 1")
    return DiffusionLimits(context, config.model.vocab_size, block_length, max_num_seqs)
