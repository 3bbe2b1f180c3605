"""The rows of a target step: which of the logits belong to which item, and what they carry back
beside the verification (logprobs, prompt logprobs, the draft's features)."""

from __future__ import annotations

import torch

from specray.actors.messages import TargetItem
from specray.kernels.proposal import PositionLogprobs, VerifyResult


def num_logits(item: TargetItem) -> int:
    """Rows of logits an item gets: its prompt rows (prompt logprobs), then the pending token's and
    each draft token's; only the prompt rows for a prompt chunk before the prompt's last."""
    return num_prompt_rows(item) + (item.proposal.num_draft_tokens + 1 if item.emits else 0)


def num_prompt_rows(item: TargetItem) -> int:
    return len(item.prompt_targets or ())


def verification_rows(items: list[TargetItem], logits: torch.Tensor) -> torch.Tensor:
    """logits [sum of num_logits, vocab_size] -> the emitting items' verification rows [sum(n + 1), vocab_size]
    (the same tensor where no item asked for prompt logprobs)."""
    if not any(item.prompt_targets for item in items):
        return logits
    rows, row0 = [], 0
    for item in items:
        row0 += num_prompt_rows(item)
        end = row0 + num_logits(item) - num_prompt_rows(item)
        rows.extend(range(row0, end))
        row0 = end
    return logits[torch.tensor(rows, dtype=torch.long)]


def logprob_entries(logits: torch.Tensor, token_ids: list[int], n: int) -> list[PositionLogprobs]:
    """logits [rows, vocab_size], a token each -> {token: its logprob, and the top n's} a row, with
    the token's rank in the vocabulary (the last of its ties)."""
    logp = logits.log_softmax(-1)  # [rows, vocab_size]
    chosen = logp.gather(1, torch.tensor(token_ids, dtype=torch.long, device=logp.device)[:, None])  # [rows, 1]
    ranks = (logp >= chosen).sum(-1).tolist()  # [rows]; tied tokens all rank ahead of it, as vLLM counts
    top = logp.topk(n, dim=-1) if n > 0 else None
    entries = []
    for j, tok in enumerate(token_ids):
        entry = {tok: float(chosen[j, 0])}
        if top is not None:
            entry.update(zip(top.indices[j].tolist(), top.values[j].tolist()))
        entries.append(PositionLogprobs.of(entry, tok, ranks[j]))
    return entries


def attach_logprobs(items: list[TargetItem], logits: torch.Tensor, results: list[VerifyResult],
                    top_n: list[int | None]) -> None:
    """Each emitted token's logprobs, from the row that drew it (past the item's prompt rows)."""
    row0 = 0
    for item, res, n in zip(items, results, top_n, strict=True):
        if n is not None and item.emits:
            rows = torch.tensor([0] + [1 + node for node in res.path_nodes()]) + row0 + num_prompt_rows(item)
            res.logprobs = logprob_entries(logits[rows], res.emitted_token_ids, n)  # rows [emitted]
        row0 += num_logits(item)


def attach_prompt_logprobs(items: list[TargetItem], logits: torch.Tensor, results: list[VerifyResult],
                            top_n: list[int | None]) -> None:
    """Each prompt row's logprobs of the prompt token after it (the item's first rows of logits)."""
    row0 = 0
    for item, res, n in zip(items, results, top_n, strict=True):
        if item.prompt_targets is not None:
            assert n is not None, "prompt targets for a sequence that asked no prompt logprobs"
            rows = logits[row0:row0 + len(item.prompt_targets)]  # [prompt rows, vocab_size]
            res.prompt_logprobs = logprob_entries(rows, item.prompt_targets, n)
        row0 += num_logits(item)


def attach_features(items: list[TargetItem], results: list[VerifyResult], wants: list[str | None],
                     features: dict[str, torch.Tensor | None]) -> None:
    """features: kind -> [num_tokens, width] -> each result's rows of its kind: its new committed
    tokens, then the accepted path (tree nodes in path order)."""
    row0 = 0
    for item, res, want in zip(items, results, wants, strict=True):
        num_new = len(item.new_token_ids)
        if want:
            rows = list(range(num_new)) + [num_new + node for node in res.path_nodes()]
            res.features = features[want][row0 + torch.tensor(rows)]  # [num_new + num_accepted, width]
        row0 += num_new + item.proposal.num_draft_tokens


def last_kv_rows(cache, slots: torch.Tensor, tp_size: int) -> torch.Tensor:
    """slots [n] -> their last-layer keys and values as written [n, 2 * kv_heads * head_dim] (LongSpec's features)."""
    if tp_size > 1:
        raise ValueError("method 'longspec' reads the target's whole last-layer KV: serve it without "
                         "tensor parallelism")
    kv = cache.kv[-1].index_select(1, slots)  # [2 * kv_heads, n, head_dim]
    return kv.transpose(0, 1).reshape(slots.shape[0], -1).float()  # the fast mode's cache is fp16
