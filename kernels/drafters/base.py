"""The `Drafter` protocol every draft algorithm implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig


@dataclass
class DraftRequest:
    """Ask for up to `num_draft_tokens` draft tokens after the committed `token_ids` (a chain's
    length, or a tree's depth), holding at most `verify_budget` draft tokens in all.

    `num_draft_tokens` 0 still lets a stateful drafter catch up with the committed tokens
    (calibration), so that its state stays in step while speculation is off.
    """

    seq_id: object
    token_ids: list[int]  # every committed token: prompt + generated (the last one is pending)
    num_draft_tokens: int
    sampling: SamplingConfig
    generator: torch.Generator | None = None
    verify_budget: int | None = None  # most draft tokens (tree nodes) this proposal may hold
    features: torch.Tensor | None = None  # the target's new final hidden states [rows, H] (feature drafts)

    def __post_init__(self) -> None:
        assert self.num_draft_tokens >= 0 and len(self.token_ids) >= 1
        assert self.verify_budget is None or self.verify_budget >= 0


class Drafter(Protocol):
    """Proposes draft tokens; may keep per-sequence state (draft KV, tables) between rounds."""

    name: str

    def propose(self, requests: list[DraftRequest]) -> list[Proposal]:
        """One proposal per request (possibly shorter than asked, possibly empty)."""
        ...

    def release(self, seq_id: object) -> None:
        """Forget a finished or preempted sequence."""
        ...
