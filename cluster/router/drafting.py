"""The router's draft side: each round's speculation lengths and verify budgets, the propose
call (the last round's calibration delta rides on it), and a draft pool's outage, which costs
speed and never a request. A mixin of Router (cluster/router/router.py), whose state it reads:
`draft`, `config`, `lengths`, `running`, `stats`."""

from __future__ import annotations

import time

import torch

from specray.actors.messages import DraftItem
from specray.cluster.pools.api import DraftUnavailable, Pending
from specray.cluster.router.failures import log
from specray.cluster.router.sequence import Sequence
from specray.kernels.proposal import Proposal


class Drafted:
    """A propose call for the sequences that draft this round; its answer keyed by sequence id."""

    def __init__(self, pending: Pending[list[Proposal]], seq_ids: list[object]):
        self.pending, self.seq_ids = pending, seq_ids

    def result(self) -> dict[object, Proposal]:
        return dict(zip(self.seq_ids, self.pending.result(), strict=True))


class DraftSide:
    """Router's methods that talk to the draft pool or size its work."""

    def num_draft_tokens(self, seq: Sequence) -> int:
        """This round's speculation length (a chain's length, a tree's depth): the request's own or
        the default, capped by load (not a seeded sampled request's: its draws would then depend on
        what else runs), by what the request may still emit and by the verify budget (a tree of
        depth L holds at least L nodes)."""
        if self.draft is None:
            return 0
        k = seq.params.num_speculative_tokens
        k = self.config.num_speculative_tokens if k is None else k
        budget = self.verify_budget(seq)
        cap = self.config.num_speculative_tokens if seq.reproducible else self.config.draft_cap(len(self.running))
        return min(k, cap, seq.max_draft_tokens(), k if budget is None else budget)

    def verify_budget(self, seq: Sequence) -> int | None:
        """The request's budget of verified draft tokens per round, within the global one and, where a
        round could verify more than the sequence's reserved KV slots left, within those (a chain's
        length or a tree's nodes never exceed `max_draft_tokens`, so elsewhere the slots hold them)."""
        budgets = [b for b in (seq.params.verify_budget, self.config.verify_budget) if b is not None]
        room = self.config.draft_room(len(seq.prompt_token_ids), seq.params.max_tokens, seq.num_tokens)
        if room < self.config.max_draft_tokens:
            budgets.append(room)
        return min(budgets) if budgets else None

    # -- the round's draft call ----------------------------------------------------------------
    def submit_propose(self, seqs: list[Sequence]) -> Drafted | None:
        """Ask the draft pool for proposals. Calibration rides along: each drafting sequence sends
        every token committed since its last call (a sequence whose speculation is off, e.g. under
        load, sends nothing and catches up the next round it drafts)."""
        lengths = [self.num_draft_tokens(s) for s in seqs]  # no draft pool: k = 0
        if self.lengths is not None:
            lengths = self._adapt(seqs, lengths)
        drafting = [(s, k) for s, k in zip(seqs, lengths) if k > 0]
        if self.lengths is not None:  # a draft catching up on more than a round commits times no draft step
            most = self.config.num_speculative_tokens + 1
            self._draft_caught_up = any(seq.num_tokens - seq.draft_sent > most for seq, _ in drafting)
        if not drafting:
            return None
        items, unknown = [], [seq for seq, _ in drafting if not seq.draft_known]
        for seq, k in drafting:
            delta = seq.token_ids[seq.draft_sent:]
            features = torch.cat(seq.draft_features) if seq.draft_features else None  # [rows, hidden_size]
            items.append(DraftItem(seq.seq_id, delta, k,
                                   seq.draft_spec() if seq.draft_sent == 0 else None, self.verify_budget(seq), features))
            seq.draft_sent, seq.draft_features, seq.draft_known = seq.num_tokens, [], True
        start = time.perf_counter()
        try:
            return Drafted(self.draft.submit_propose(items), [s.seq_id for s, _ in drafting])
        except Exception as e:  # noqa: BLE001 - a lost or failing draft pool costs speed, never a request
            if getattr(e, "sent", True) is False:  # refused unsent: the drafter has none of them to release
                for seq in unknown:
                    seq.draft_known = False
            self._lose_draft_state(e)
            return None
        finally:  # in-process pools compute here; remote ones only send
            self.stats.draft_seconds += time.perf_counter() - start

    def _adapt(self, seqs: list[Sequence], caps: list[int]) -> list[int]:
        """The policy's lengths, within each cap; seeded sampled sequences keep theirs."""
        steered = [i for i, s in enumerate(seqs) if caps[i] > 0 and not s.reproducible]
        fixed_rows = sum(caps) - sum(caps[i] for i in steered)
        prefill_rows = sum(s.chunk for s in self.running if s.prefilling)
        chosen = self.lengths.lengths([(seqs[i].acceptance, caps[i]) for i in steered],
                                      len(seqs) + fixed_rows + prefill_rows)
        lengths = list(caps)
        for i, k in zip(steered, chosen, strict=True):
            lengths[i] = k
        return lengths

    def collect_proposals(self, seqs: list[Sequence], pending: Drafted | None) -> dict[str, Proposal]:
        proposals = {s.seq_id: Proposal([]) for s in seqs}
        if pending is None:
            return proposals
        start = time.perf_counter()
        try:
            drafted = pending.result()
            self._check_vocabulary(drafted.values())
        except Exception as e:  # noqa: BLE001 - a lost or failing draft pool costs speed, never a request
            self._lose_draft_state(e)
            return proposals
        finally:
            self.stats.draft_seconds += time.perf_counter() - start
        proposals.update((seq_id, p) for seq_id, p in drafted.items() if seq_id in proposals)
        self._draft_down = False
        return proposals

    def _check_vocabulary(self, proposals) -> None:
        """A draft's distributions over another vocabulary (a gRPC drafter started with another
        model) failed every sampled request in verification: DraftUnavailable instead."""
        vocab = self.config.vocab_size
        for p in proposals:
            if p.draft_probs is not None and p.draft_probs.shape[-1] != vocab:
                raise DraftUnavailable(f"the draft proposes over {p.draft_probs.shape[-1]} tokens, the target's "
                                       f"vocabulary has {vocab}: a draft of another model is not used")

    def _lose_draft_state(self, error: Exception) -> None:
        """Target-only decoding this round; the draft side is rebuilt from the full history
        (prompt, committed tokens, sampling spec) once it answers again. A DraftUnavailable is
        expected (a worker restarts); anything else is a draft bug, logged."""
        if not isinstance(error, DraftUnavailable):
            log.error("the draft pool failed; this round decodes target-only", exc_info=error)
        elif not self._draft_down:  # once an outage, on every transport
            log.warning("the draft pool is unavailable (%s); decoding target-only until it answers", error)
        self._draft_down = True
        self.stats.draft_fallbacks += 1
        for seq in self.running:
            seq.draft_sent = 0
