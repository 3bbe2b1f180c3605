"""The request bookkeeping both routers share: queue, abort, failures, and the outputs of a round.

A request is n sequences (its choices); a router subclass says how a sequence leaves the running
batch (`_retire`) and what runs a round (`step`).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, replace

from specray.cluster.outputs import RequestOutput, SpecMetrics
from specray.cluster.params import SamplingParamError, SamplingParams
from specray.cluster.router.bad_words import bad_words_token_ids
from specray.cluster.router.failures import RequestFailed, request_failed
from specray.cluster.router.sequence import Sequence


MAX_BAD_WORD_LISTS = 1024  # tokenised bad_words lists held (all dropped when full)
MAX_TARGET_RETRIES = 1  # runs again after a lost target; a request that keeps breaking workers then fails


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    retries: int = 0  # times a lost target's restart ran it again from its prompt


class RequestBook:
    """Requests, their waiting and running sequences, and failures; `config.check_request` and
    `config.max_model_len` come from the subclass's limits."""

    def __init__(self, tokenizer, eos_token_ids, config):
        self.tokenizer, self.config = tokenizer, config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.requests: dict[str, _Request] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.failures: list[tuple[str, RequestFailed]] = []  # failed inside a worker; see take_failures
        self._ids = itertools.count()
        self._bad_words_ids: dict[tuple[str, ...], tuple[tuple[int, ...], ...]] = {}  # see _bad_words

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None = None,
                    request_id: str | None = None, checked: bool = False) -> str:
        """Validate and queue a request; a bad one raises ValueError and touches nothing else.
        `checked`: the caller ran `check_prompt` on these very arguments just before (a batch that is
        validated whole before any of it is added)."""
        if not checked:
            self.check_prompt(prompt_token_ids, params)
        kept = params.truncated(prompt_token_ids, self.config.max_model_len)
        if len(kept) < len(prompt_token_ids):  # the text no longer spells the prompt: outputs and echo decode the ids
            prompt_token_ids, prompt = kept, None
        params = params.for_prompt(len(prompt_token_ids), self.config.max_model_len)
        request_id = request_id or str(next(self._ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        bad = self._bad_words(params)
        seqs = [Sequence(f"{request_id}/{i}", request_id, i, list(prompt_token_ids), params,
                         self.eos_token_ids, self.config.max_model_len, bad_words_ids=bad) for i in range(params.n)]
        self.requests[request_id] = _Request(request_id, prompt, list(prompt_token_ids), seqs)
        self.waiting.extend(seqs)
        return request_id

    def check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """A request the engine could never run raises ValueError (the limits' check_request), its
        prompt as `truncate_prompt_tokens` leaves it."""
        params.check()  # before the cut: a field changed since the parameters were built is refused by name
        kept = params.truncated(prompt_token_ids, self.config.max_model_len)
        try:
            self.config.check_request(kept, params, has_tokenizer=self.tokenizer is not None)
        except SamplingParamError as e:
            if e.param != "prompt" or len(kept) == len(prompt_token_ids):
                raise
            raise SamplingParamError("prompt", f"{e} (truncate_prompt_tokens={params.truncate_prompt_tokens} kept "
                                               f"the last {len(kept)} of its {len(prompt_token_ids)})") from None
        self._check_drawable(params)

    def _check_drawable(self, params: SamplingParams) -> None:
        """allowed_token_ids that one-token bad_words ban always, with those min_tokens bans at first
        (each an EOS or stop token id), leave no token to draw: every path would emit an arbitrary one."""
        if not params.allowed_token_ids:
            return
        allowed = set(params.allowed_token_ids)
        banned = {ids[0] for ids in self._bad_words(params) if len(ids) == 1}  # a longer word bans after its prefix only
        if allowed <= banned:
            raise SamplingParamError("bad_words", "bad_words ban every allowed token: no token could be drawn")
        ending = (set() if params.ignore_eos else set(self.eos_token_ids)) | set(params.stop_token_ids)
        if params.min_tokens and allowed <= ending | banned:
            raise SamplingParamError("allowed_token_ids", "every allowed token ends the output, which "
                                     f"min_tokens={params.min_tokens} forbids at first, or is a bad word: "
                                     "no token could be drawn")

    def _bad_words(self, params: SamplingParams) -> tuple[tuple[int, ...], ...]:
        if not params.bad_words or self.tokenizer is None:
            return ()
        words = tuple(params.bad_words)
        if words not in self._bad_words_ids:  # tokenised once per list of words, not twice per request
            if len(self._bad_words_ids) >= MAX_BAD_WORD_LISTS:
                self._bad_words_ids.clear()
            self._bad_words_ids[words] = bad_words_token_ids(self.tokenizer, list(words))
        return self._bad_words_ids[words]

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for seq in req.seqs:
            if seq in self.waiting:
                self.waiting.remove(seq)
            if seq in self.running:
                self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        raise NotImplementedError

    def fail_request(self, request_id: str, error: BaseException) -> None:
        """Abort one request that broke a round; its consumer gets a RequestFailed."""
        if request_id in self.requests:
            self.abort(request_id)
            self.failures.append((request_id, request_failed(request_id, error)))

    def take_failures(self) -> list[tuple[str, RequestFailed]]:
        """(request id, error) of requests failed since the last call."""
        failures, self.failures = self.failures, []
        return failures

    def fail_all(self) -> list[str]:
        """After a lost target (every KV cache or canvas is gone): requests that emitted nothing run
        again from their prompts once the pool restarts; the others are forgotten. -> their ids."""
        retried = self._restartable()
        again = {r.request_id for r in retried}
        lost = [rid for rid in self.requests if rid not in again]
        self._forget_running()
        self.waiting.clear()
        self.requests.clear()
        self.stats.target_failures += 1
        self._requeue(retried)
        return lost

    def _forget_running(self) -> None:
        """Drop the running batch after a lost target (its workers hold nothing any more)."""
        raise NotImplementedError

    def _restartable(self) -> list[_Request]:
        """Requests a lost target can run again from their prompt: nothing of them was emitted (so no
        consumer can tell) and they were not retried already."""
        return [r for r in self.requests.values() if r.retries < MAX_TARGET_RETRIES
                and not any(s.output_token_ids or s.finished for s in r.seqs)]

    def _requeue(self, reqs: list[_Request]) -> None:
        """Queue `reqs` again, ahead of the others, as fresh sequences (no KV anywhere)."""
        for req in reversed(reqs):
            seqs = [seq.fresh() for seq in req.seqs]
            self.requests[req.request_id] = replace(req, seqs=seqs, retries=req.retries + 1)
            self.waiting.extendleft(reversed(seqs))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def outputs(self, seqs: list[Sequence]) -> list[RequestOutput]:
        """The changed requests' outputs; a finished request is forgotten."""
        out = []
        for request_id in dict.fromkeys(s.request_id for s in seqs):
            req = self.requests.get(request_id)
            if req is None:  # aborted meanwhile
                continue
            finished = all(s.finished for s in req.seqs)
            out.append(RequestOutput(request_id, req.prompt, req.prompt_token_ids, [s.completion() for s in req.seqs],
                                     finished, SpecMetrics.total([s.metrics for s in req.seqs]),
                                     req.seqs[0].prompt_logprobs_output(),
                                     max(s.num_cached_tokens for s in req.seqs)))
            if finished:
                del self.requests[request_id]
        return out
