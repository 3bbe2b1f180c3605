"""The router: continuous batching over a target pool and an optional draft pool.

A round for a group of sequences is propose -> verify -> commit: the draft pool proposes (the
calibration delta of the last round rides on the same call), then one ragged target pass
prefills newly admitted sequences and verifies everyone else's proposals. `step` runs one round
for every running sequence, or, pipelined, one slot of the two-group pipeline (cluster/router/pipeline.py).
The pools may be in-process workers or Ray actors; the router only sees `pools/api.py`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from specray.actors.messages import TargetItem
from specray.cluster.outputs import RequestOutput
from specray.cluster.pools.api import Done, DraftPool, Pending, TargetPool, TargetUnavailable
from specray.cluster.router.adaptive import length_policy
from specray.cluster.router.admission import admit
from specray.cluster.router.drafting import DraftSide
from specray.cluster.router.limits import RouterLimits, RouterStats
from specray.cluster.router.pipeline import Pipeline
from specray.cluster.router.requests import RequestBook
from specray.cluster.router.sequence import Sequence
from specray.kernels.proposal import Proposal, VerifyResult
from specray.kernels.verify.rules import pick_rule


class Router(DraftSide, RequestBook):
    def __init__(self, target: TargetPool, draft: DraftPool | None, tokenizer, eos_token_ids,
                 config: RouterLimits):
        super().__init__(tokenizer, eos_token_ids, config)
        self.target, self.draft = target, draft
        self.reserved_tokens = 0
        self.stats = RouterStats()
        self.pipeline = Pipeline(self) if config.pipelined and draft is not None else None
        self.lengths = length_policy(target, draft, config)  # adaptive draft lengths, or None
        self._draft_caught_up = False  # this round's draft call fed more than a round's tokens
        self._draft_down = False  # the last draft call failed (an outage is logged once)
        # called once a round's target step is sent: a server hands out the last round's outputs
        # then, while the target computes, instead of before this round's calls
        self.after_submit: Callable[[], None] | None = None

    # -- requests (the rest in RequestBook) -----------------------------------------------------
    def _forget_running(self) -> None:
        for seq in list(self.running):
            self._retire(seq, target_alive=False)
        if self.pipeline is not None:
            self.pipeline.reset()

    # -- scheduling -------------------------------------------------------------------------
    def admit(self, limit: int | None = None) -> list[Sequence]:
        """Plan the round's prefill and admit waiting sequences (cluster/router/admission.py)."""
        return admit(self, limit)

    # -- the round's parts (shared by the sync round and the pipeline; the draft's in DraftSide) --
    def submit_verify(self, seqs: list[Sequence], proposals: dict[str, Proposal]) -> Pending[list[VerifyResult]]:
        """Send the round to the target pool; an error other than TargetUnavailable waits in the
        pending result, for collect_verify to isolate."""
        start = time.perf_counter()
        try:
            return self.target.submit_step([self._target_item(seq, proposals) for seq in seqs])
        except TargetUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - in-process pools compute (and fail) at submit
            return Done(error=e)
        finally:
            self._count_target_time(seqs, time.perf_counter() - start)

    def _target_item(self, seq: Sequence, proposals: dict[str, Proposal]) -> TargetItem:
        if not seq.prefilling:
            proposal = proposals.get(seq.seq_id, Proposal([]))
            self._check_budget(seq, proposal)
            return TargetItem(seq.seq_id, seq.output_token_ids[-1:], proposal, rule=self._rule(seq, proposal))
        # prefill (the round's chunk of the prompt): the first token comes from the prompt's last position
        start, end = seq.prefilled, seq.prefilled + seq.chunk
        assert seq.chunk >= 1, "a prefilling sequence in a step has its chunk planned"
        # a request that never drafts (num_speculative_tokens 0) would collect features nothing reads
        features = None if seq.params.num_speculative_tokens == 0 else self.config.draft_features
        spec = dataclasses.replace(seq.spec(), features=features) if start == 0 else None
        prompt = seq.prompt_token_ids
        targets = None if seq.params.prompt_logprobs is None else prompt[start + 1:end + 1]  # each row's next token
        rest = prompt[end:] if start == 0 and end < len(prompt) else None  # what the prefix cache may hold too
        return TargetItem(seq.seq_id, prompt[start:end], Proposal([]), spec, emits=end == len(prompt),
                          prompt_targets=targets, prompt_rest=rest)

    def _rule(self, seq: Sequence, proposal: Proposal) -> str:
        """The rule for this round (kernels/verify/rules.py); the target worker checks it again."""
        return pick_rule(proposal, seq.params.temperature == 0.0, self.config.verify_rule)

    def _check_budget(self, seq: Sequence, proposal: Proposal) -> None:
        budget = self.verify_budget(seq)
        if budget is not None and proposal.num_draft_tokens > budget:
            raise ValueError(f"a proposal of {proposal.num_draft_tokens} draft tokens exceeds verify_budget {budget}")

    def collect_verify(self, seqs: list[Sequence], pending: Pending[list[VerifyResult]],
                       proposals: dict[str, Proposal]) -> list[Sequence]:
        """Commit the results of still-running sequences; returns the ones committed. A failed
        step is retried one sequence at a time, so only the request that breaks it fails."""
        start = time.perf_counter()
        try:
            results = pending.result()
        except TargetUnavailable:
            raise
        except Exception as error:  # noqa: BLE001 - the worker left every KV as it was
            return self._isolate(seqs, proposals, error)
        finally:
            self._count_target_time(seqs, time.perf_counter() - start)
        return self._commit_all(seqs, results)

    def _count_target_time(self, seqs: list[Sequence], seconds: float) -> None:
        self.stats.target_seconds += seconds
        if any(seq.prefilling for seq in seqs):  # a prefill rode in this step
            self.stats.prefill_seconds += seconds

    def _isolate(self, seqs: list[Sequence], proposals: dict[str, Proposal], error: Exception) -> list[Sequence]:
        if len(seqs) == 1:
            self.fail_request(seqs[0].request_id, error)
            return []
        committed = []
        for seq in seqs:
            if seq not in self.running:  # aborted, or a sibling choice failed
                continue
            try:
                results = self.submit_verify([seq], proposals).result()
            except TargetUnavailable:
                raise
            except Exception as solo_error:  # noqa: BLE001
                self.fail_request(seq.request_id, solo_error)
                continue
            committed += self._commit_all([seq], results)
        return committed

    def _commit_all(self, seqs: list[Sequence], results: list[VerifyResult]) -> list[Sequence]:
        committed = []
        for seq, res in zip(seqs, results, strict=True):
            if seq in self.running:  # aborted while in flight: nothing to commit
                self._commit(seq, res)
                committed.append(seq)
        return committed

    # -- the round --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One round for every running sequence (or one pipeline slot); returns changed requests."""
        self.stats.steps += 1
        if self.pipeline is not None:
            return self.pipeline.slot()
        self.admit()
        if not self.running:
            return []
        group = list(self.running)
        decoding = [s for s in group if not s.prefilling]
        before = (time.perf_counter(), self.stats.draft_seconds, self.stats.prefill_seconds)
        proposals = self.collect_proposals(decoding, self.submit_propose(decoding))
        pending = self.submit_verify(group, proposals)
        if self.after_submit is not None:
            self.after_submit()
        outputs = self.news(self.collect_verify(group, pending, proposals))
        self._observe(len(group), proposals, before)
        return outputs

    def news(self, seqs: list[Sequence]) -> list[RequestOutput]:
        """The outputs of requests that changed (a prompt chunk before the last changes nothing)."""
        return self.outputs([s for s in seqs if not s.prefilling or s.finished])

    def _observe(self, num_seqs: int, proposals: dict[str, Proposal], before: tuple[float, ...]) -> None:
        """Tell the length policy what a round without a prefill cost (a prefill's step says
        nothing about a decoding row's)."""
        start, draft, prefill = before
        if self.lengths is None or self.stats.prefill_seconds != prefill:
            return
        lengths = [p.num_draft_tokens for p in proposals.values()]
        drafted = None if self._draft_caught_up else self.stats.draft_seconds - draft
        self.lengths.observe(num_seqs + sum(lengths), time.perf_counter() - start, drafted, lengths)

    def _commit(self, seq: Sequence, res: VerifyResult) -> None:
        decoding = not seq.prefilling  # a prompt chunk's step is no round (nor the prefill's first token)
        seq.num_cached_tokens += res.num_cached_tokens
        self.stats.prefix_cache_hits += res.num_cached_tokens
        self.stats.prefix_cache_queries += res.num_queried_tokens
        if decoding:
            self.stats.record_round(res)
            if self.lengths is not None and res.num_draft_tokens:
                self.lengths.record(seq.acceptance, res.num_draft_tokens, res.num_accepted)
        else:  # the round's prompt chunk is cached, and what the prefix cache held past it
            seq.prefilled, seq.chunk = seq.prefilled + max(seq.chunk, res.num_cached_tokens), 0
            if res.prompt_logprobs is not None:
                seq.prompt_logprobs = seq.prompt_logprobs or []
                seq.prompt_logprobs.extend(res.prompt_logprobs)
        if res.features is not None:
            seq.draft_features.append(res.features)
        if res.next_token_id is None:  # a prompt chunk before the last: nothing drawn
            return
        kept = seq.commit(res.emitted_token_ids, res.logprobs, self.tokenizer)  # no tokenizer: ids only
        if decoding:
            seq.metrics.add_round(res.num_draft_tokens, res.num_accepted, kept)
        if seq.finished:
            self._retire(seq)

    def _retire(self, seq: Sequence, target_alive: bool = True) -> None:
        self.running.remove(seq)
        self.reserved_tokens -= self.config.reservation(len(seq.prompt_token_ids), seq.params.max_tokens)
        if target_alive:
            self.target.release(seq.seq_id)
        if self.draft is not None and seq.draft_known:  # draft_sent is 0 again after a failed draft call
            self.draft.release(seq.seq_id)
