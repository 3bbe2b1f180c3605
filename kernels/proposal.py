"""What a drafter returns for one sequence, and what the verifier returns for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

KINDS = ("chain", "wor_tree", "iid", "deterministic_tree")  # the rule each needs: kernels/verify/rules.py


@dataclass
class Proposal:
    """A chain or a tree of draft tokens and the proposal distribution each was drawn from.

    `draft_probs` None means the drafter is deterministic (n-gram lookup, greedy drafting, top-k
    trees): each token is a point mass. For trees, row i is the draft distribution at node i's
    parent (the one its siblings were drawn from too; the verifier removes earlier siblings itself).

    `parents[i]` is the index of node i's parent among the draft tokens, -1 for a child of the
    pending token; parents precede children. `counts[i]` (iid only) is how many of the i.i.d. draft
    chains pass through node i.
    """

    draft_token_ids: list[int]  # [num_nodes]
    draft_probs: torch.Tensor | None = None  # [num_nodes, vocab_size]
    parents: list[int] | None = None  # [num_nodes]; None: a chain
    kind: str = "chain"
    counts: list[int] | None = None  # [num_nodes]; iid only

    def __post_init__(self) -> None:
        n = len(self.draft_token_ids)
        if self.kind not in KINDS:
            raise ValueError(f"unknown proposal kind {self.kind!r}; choose one of {KINDS}")
        if self.draft_probs is not None:
            assert self.draft_probs.shape[0] == n
        if self.kind == "chain":
            assert self.parents is None or self.parents == list(range(-1, n - 1)), "a chain's parents are i - 1"
        else:
            assert self.parents is not None and len(self.parents) == n, "a tree needs one parent per node"
            assert all(-1 <= p < i for i, p in enumerate(self.parents)), "parents precede children"
            if n:
                siblings = {(p, t) for p, t in zip(self.parents, self.draft_token_ids)}
                assert len(siblings) == n, "siblings carry distinct tokens (a trie)"
        if self.kind == "iid":
            assert self.counts is not None and len(self.counts) == n and all(c >= 1 for c in self.counts)
        else:
            assert self.counts is None, "counts belong to iid proposals"
        if self.kind in ("wor_tree", "iid") and n:
            assert self.draft_probs is not None, f"a {self.kind} proposal carries its draft distributions"
        if self.kind == "deterministic_tree":
            assert self.draft_probs is None, "a deterministic tree carries no draft distributions"

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft_token_ids)

    @property
    def is_tree(self) -> bool:
        return self.kind != "chain"

    def tree_parents(self) -> list[int]:
        """[num_nodes] parent per node, chains included."""
        return self.parents if self.parents is not None else list(range(-1, self.num_draft_tokens - 1))

    def depths(self) -> list[int]:
        """[num_nodes] depth of each node: 1 for a child of the pending token."""
        out: list[int] = []
        for p in self.tree_parents():
            out.append(1 if p < 0 else out[p] + 1)
        return out


class PositionLogprobs(dict):
    """{token id: logprob} at one position: `token`'s (the drawn token, or the prompt's) and the top
    n; `rank` is `token`'s rank in the whole vocabulary (1: the most likely), which the top n alone
    cannot tell where it ranks below them."""

    token: int | None = None
    rank: int | None = None

    @classmethod
    def of(cls, entries: dict[int, float], token: int, rank: int) -> "PositionLogprobs":
        row = cls(entries)
        row.token, row.rank = token, rank
        return row

    def top(self, n: int) -> "PositionLogprobs":
        """`token`'s entry and the n most likely (ties by token id)."""
        kept = sorted(self.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return PositionLogprobs.of({**dict(kept), self.token: self[self.token]}, self.token, self.rank)


@dataclass
class VerifyResult:
    """One round's outcome for one sequence: accepted draft tokens, then recovered or bonus.

    For trees `accepted_nodes` holds the accepted path's node indices (the KV to keep); the bonus
    token follows a path that reached a leaf.
    """

    accepted_token_ids: list[int]
    # recovered at the first rejection, bonus after a fully accepted path; None for a prompt chunk
    # before the prompt's last (chunked prefill: its KV is cached, no token is drawn)
    next_token_id: int | None
    is_bonus: bool
    num_draft_tokens: int
    logprobs: list[dict[int, float]] | None = field(default=None)  # per emitted token
    prompt_logprobs: list[dict[int, float]] | None = None  # per TargetItem.prompt_targets token
    accepted_nodes: list[int] | None = None  # [num_accepted] trees only
    # The target's final hidden state at every position it kept this step (the new committed tokens,
    # then the accepted path) [rows, hidden_size]; only for sequences whose draft reads features.
    features: torch.Tensor | None = None
    num_cached_tokens: int = 0  # the step's new prompt tokens found in the prefix cache (not computed)
    num_queried_tokens: int = 0  # a sequence's first step: its prompt's tokens, where it looked them up

    def __post_init__(self) -> None:
        assert len(self.accepted_token_ids) <= self.num_draft_tokens and self.num_cached_tokens >= 0
        if self.next_token_id is None:
            assert self.num_draft_tokens == 0 and not self.is_bonus and self.accepted_nodes is None
        elif self.accepted_nodes is None:
            assert self.is_bonus == (len(self.accepted_token_ids) == self.num_draft_tokens)
        else:
            assert len(self.accepted_nodes) == len(self.accepted_token_ids)
            assert all(a < b for a, b in zip(self.accepted_nodes, self.accepted_nodes[1:]))

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_token_ids)

    @classmethod
    def prompt_chunk(cls) -> "VerifyResult":
        """A prompt chunk before the prompt's last: cached, nothing drawn or emitted."""
        return cls([], None, False, 0)

    @property
    def emitted_token_ids(self) -> list[int]:
        return [] if self.next_token_id is None else [*self.accepted_token_ids, self.next_token_id]

    def path_nodes(self) -> list[int]:
        """[num_accepted] accepted node indices, chains included."""
        return self.accepted_nodes if self.accepted_nodes is not None else list(range(self.num_accepted))

