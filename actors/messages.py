"""Messages between the router and the worker pools. Plain data: they cross Ray, gRPC or
torch.distributed unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specray.kernels.proposal import Proposal
from specray.kernels.sampling import SamplingConfig


@dataclass
class SeqSpec:
    """What a worker needs to know about a sequence once, when it first sees it."""

    sampling: SamplingConfig
    seed: int | None = None
    logprobs: int | None = None  # top-n logprobs to return per emitted token; None for none
    prompt_logprobs: int | None = None  # top-n logprobs to return per prompt token; None for none
    # what the target returns for the draft (Method.target_features): "hidden", its final hidden
    # states (eagle); "last_kv", its last layer's keys and values (longspec); None: nothing
    features: str | None = None
    prompt_len: int = 0  # tokens of the prompt: penalties tell its tokens from the output's by position
    cache_salt: str | None = None  # the target's prefix cache shares blocks only between equal salts


@dataclass
class TargetItem:
    """One sequence's share of a target step.

    `new_token_ids` are committed tokens the target has not cached yet: the prompt (or its next chunk) at
    prefill, the pending (last emitted) token in decode. The proposal's draft tokens follow them.
    """

    seq_id: object
    new_token_ids: list[int]
    proposal: Proposal
    spec: SeqSpec | None = None  # set on the first step of a sequence
    # Verification rule the router picked from the proposal's kind (kernels/verify/rules.py);
    # None: the worker picks it the same way. A rule that cannot verify the proposal is an error.
    rule: str | None = None
    # False for a prompt chunk before the prompt's last (chunked prefill): its KV is cached and no
    # token is drawn, so a seeded sequence's generator is untouched until its prompt is whole
    emits: bool = True
    # prompt logprobs wanted: the prompt tokens this chunk's first rows predict, one a row (the next
    # chunk's first token for a chunk's last row; none for the prompt's last row, which draws)
    prompt_targets: list[int] | None = None
    # a chunked prompt's first item: the prompt's tokens after this chunk. The prefix cache may hold
    # more of the prompt than the chunk; the result's num_cached_tokens then says how much, and the
    # router's next chunk starts after it
    prompt_rest: list[int] | None = None

    def __post_init__(self) -> None:
        assert len(self.new_token_ids) >= 1
        assert self.prompt_rest is None or not self.emits, "the rest of a prompt follows a chunk before its last"
        assert self.prompt_targets is None or len(self.prompt_targets) == len(self.new_token_ids) - self.emits
        assert self.emits or self.proposal.num_draft_tokens == 0, "a prompt chunk carries no proposal"


@dataclass
class DraftItem:
    """One sequence's share of a propose call; the calibration delta rides on it.

    `committed_delta` holds the tokens committed since the last message for this sequence (the
    prompt and first token on the first call).
    """

    seq_id: object
    committed_delta: list[int]
    num_draft_tokens: int  # chain length, or the depth of a tree
    spec: SeqSpec | None = None
    verify_budget: int | None = None  # most draft tokens (tree nodes) the target verifies this round
    # What the target returned for the draft at the positions it kept since the last message
    # (VerifyResult.features, concatenated): [rows, hidden_size] final hidden states (eagle) or
    # [rows, 2 * kv_heads * head_dim] last-layer keys and values (longspec); None for other methods.
    features: "torch.Tensor | None" = None

    def __post_init__(self) -> None:
        assert self.num_draft_tokens >= 0
        assert self.verify_budget is None or self.verify_budget >= 0
