"""Lookup first, model otherwise: a round's proposal for a sequence is the continuation of an
earlier occurrence of its last n tokens (prompt lookup, n >= `min_match`) when one exists, and the
draft model's proposal when none does.

Small targets repeat their prompt and themselves (lists, code, quoted passages, loops under greedy
decoding); there a lookup proposes long runs for free, where a small draft agrees token by token.
Elsewhere the model drafts as usual.

Exactness: a lookup proposal is deterministic, so it travels as point masses (`draft_probs` None)
and is verified as a chain with q = one-hot, exactly like `NgramDrafter`'s. A model proposal keeps
its own distributions. The two never mix inside one proposal.

Calibration: a sequence the model skipped catches up at its next model round (the model drafter
feeds every committed token it lacks in one ragged step), so lookup rounds cost no model step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from specray.kernels.drafters.base import Drafter, DraftRequest
from specray.kernels.drafters.ngram import lookup
from specray.kernels.proposal import Proposal

KEYS = ("min_match", "max_match", "model_tokens")


@dataclass(frozen=True)
class LookupOptions:
    """speculative_config['lookup_first']: true, or a dict of these keys."""

    min_match: int = 2  # shortest trailing n-gram that counts as a match
    max_match: int = 8  # longest one, tried first (the most specific continuation)
    # The draft model's chain length (tree depth) at most; None: num_speculative_tokens. A lookup
    # may propose up to num_speculative_tokens: long runs are free to draft, model steps are not.
    model_tokens: int | None = None

    def __post_init__(self) -> None:
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (self.min_match, self.max_match))
        if not ok or not 1 <= self.min_match <= self.max_match:
            raise ValueError("lookup_first needs integers 1 <= min_match <= max_match, got "
                             f"{self.min_match} and {self.max_match}")
        m = self.model_tokens
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise ValueError(f"lookup_first model_tokens must be an integer >= 1, got {m!r}")

    @classmethod
    def from_dict(cls, raw) -> "LookupOptions":
        if raw is True:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError(f"lookup_first must be true or a dict of {KEYS}, got {raw!r}")
        unknown = sorted(set(raw) - set(KEYS))
        if unknown:
            raise ValueError(f"unknown lookup_first keys {unknown}; known keys: {list(KEYS)}")
        return cls(**raw)


class LookupFirstDrafter:
    """A Drafter: prompt lookup first, `model_drafter` (chains or trees) where it finds nothing."""

    def __init__(self, model_drafter: Drafter, options: LookupOptions | None = None):
        self.model_drafter = model_drafter
        self.options = options or LookupOptions()
        self.name = f"{model_drafter.name}+lookup"
        self.lookup_rounds = 0  # proposals (one per sequence per round) that the lookup made
        self.model_rounds = 0  # proposals that the model made

    def _lookup(self, r: DraftRequest) -> list[int]:
        """Up to num_draft_tokens (within the verify budget) tokens after the earliest occurrence of
        the longest trailing n-gram that recurs (`ngram.lookup`); [] when none does."""
        k = r.num_draft_tokens if r.verify_budget is None else min(r.num_draft_tokens, r.verify_budget)
        if k <= 0:
            return []
        tokens = np.asarray(r.token_ids, dtype=np.int64)  # [seq_len]
        return lookup(tokens, k, self.options.min_match, self.options.max_match)

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        found = [self._lookup(r) for r in requests]
        model_rows = [i for i, d in enumerate(found) if not d]
        out: list[Proposal | None] = [Proposal(d) if d else None for d in found]
        if model_rows:
            asked = [self._for_model(requests[i]) for i in model_rows]
            for i, p in zip(model_rows, self.model_drafter.propose(asked), strict=True):
                out[i] = p
        lookup_rows = [requests[i] for i, d in enumerate(found) if d]
        defer = getattr(self.model_drafter, "defer", None)  # feature drafts keep the target's features
        if lookup_rows and defer is not None:
            defer(lookup_rows)
        self.model_rounds += len(model_rows)
        self.lookup_rounds += len(requests) - len(model_rows)
        return out  # type: ignore[return-value]

    def _for_model(self, r: DraftRequest) -> DraftRequest:
        cap = self.options.model_tokens
        if cap is None or r.num_draft_tokens <= cap:
            return r
        return dataclasses.replace(r, num_draft_tokens=cap)

    def release(self, seq_id: object) -> None:
        self.model_drafter.release(seq_id)
