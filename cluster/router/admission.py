"""Admission and the round's prefill plan (chunked prefill).

A round's prompt tokens are bounded (`max_prefill_tokens`): a first token waits only for the prompts
ahead of it, and running sequences keep decoding beside a long prompt, whose rows are computed over
several rounds exactly as in one step (a row's numbers do not depend on its step).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from specray.cluster.router.limits import RouterLimits
from specray.cluster.router.sequence import Sequence


class Book(Protocol):
    """What admission reads and moves: the router's queues, limits and KV reservation."""

    config: RouterLimits
    requests: dict  # request id -> its record (`.seqs`: its choices)
    running: list[Sequence]
    waiting: deque[Sequence]
    reserved_tokens: int


def admit(router: Book, limit: int | None = None) -> list[Sequence]:
    """Plan the round's prefill, then move waiting sequences to running while KV and `max_num_seqs`
    allow (at most `limit`). The round's prompt-token budget (`max_prefill_tokens`; None: no bound)
    goes first to a prompt already part-prefilled, then to waiting prompts in order: whole where they
    fit, while a prompt longer than the budget takes what is left and goes on next round (chunked
    prefill); a shorter one waits for a round it fits whole (cut, its first token would come no
    sooner and its round would be slower). So at most one prompt is part-prefilled at a time, and it
    gets the budget first. A prompt is charged the tokens it will compute (`prefill_cost`)."""
    budget = router.config.prefill_budget(decoding=any(not s.prefilling for s in router.running))
    left = _plan_running(router.running, budget)
    admitted: list[Sequence] = []
    while router.waiting and len(router.running) < router.config.max_num_seqs and (left is None or left > 0):
        if limit is not None and len(admitted) >= limit:
            break
        seq = router.waiting[0]
        cost = prefill_cost(router, seq)
        if left is not None and left < cost <= budget:
            break
        need = router.config.reservation(len(seq.prompt_token_ids), seq.params.max_tokens)
        if router.reserved_tokens + need > router.config.kv_capacity_tokens:
            break
        router.waiting.popleft()
        router.reserved_tokens += need
        router.running.append(seq)
        admitted.append(seq)
        seq.chunk = seq.next_chunk(left if cost == len(seq.prompt_token_ids) else None)
        left = None if left is None else left - min(seq.chunk, cost)
    return admitted


def prefill_cost(router: Book, seq: Sequence) -> int:
    """Prompt tokens a waiting sequence's prefill computes: all of them, but for a later choice of a
    request whose first choice has prefilled the same prompt, where the prefix cache holds it, only
    what follows its last full block before the prompt's last token (n choices cost about one
    prompt's budget, not n; should the blocks have gone, the round computes more, never less)."""
    n, config = len(seq.prompt_token_ids), router.config
    if not config.prefix_caching or seq.index == 0 or seq.params.prompt_logprobs is not None:
        return n
    request = router.requests.get(seq.request_id)
    if request is None or request.seqs[0].prefilling:
        return n
    return n - (n - 1) // config.block_size * config.block_size


def _plan_running(running: list[Sequence], budget: int | None) -> int | None:
    """The next chunk of a part-prefilled prompt among `running`; returns the budget left."""
    left = budget
    for seq in running:
        if seq.prefilling:
            seq.chunk = seq.next_chunk(left)
            left = None if left is None else left - seq.chunk
    return left
