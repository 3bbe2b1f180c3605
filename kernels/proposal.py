"""What a drafter returns for one sequence, and what the verifier returns for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Proposal:
    """A chain of draft tokens and the proposal distribution each was drawn from.

    `draft_probs` None means the drafter is deterministic (n-gram lookup, greedy drafting): each
    token is a point mass, and verification accepts it with probability q(token).
    """

    draft_token_ids: list[int]  # [k]
    draft_probs: torch.Tensor | None = None  # [k, vocab_size]

    def __post_init__(self) -> None:
        if self.draft_probs is not None:
            assert self.draft_probs.shape[0] == len(self.draft_token_ids)

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft_token_ids)


@dataclass
class VerifyResult:
    """One round's outcome for one sequence: accepted draft tokens, then recovered or bonus."""

    accepted_token_ids: list[int]
    next_token_id: int  # recovered at the first rejection, bonus after a fully accepted chain
    is_bonus: bool
    num_draft_tokens: int
    logprobs: list[dict[int, float]] | None = field(default=None)  # per emitted token

    def __post_init__(self) -> None:
        assert len(self.accepted_token_ids) <= self.num_draft_tokens
        assert self.is_bonus == (len(self.accepted_token_ids) == self.num_draft_tokens)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_token_ids)

    @property
    def emitted_token_ids(self) -> list[int]:
        return [*self.accepted_token_ids, self.next_token_id]
