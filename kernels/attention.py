"""Attention over ragged batches with chain (causal) or tree masks.

`reference_attention` is the specification: one sequence at a time, explicit math.
Fast paths, which tests hold to the reference:
- one sequence (`ragged_attention`): grouped bmm for few query rows, fused SDPA for prefill;
- several sequences (`batch_attention`): each query scores its own sequence's keys only. Short
  sequences (decode, verification) of similar key counts share one padded kernel call, padded
  inside attention only (`PaddedGroup`, waste bounded by PAD_WASTE); prefill chunks attend alone.
  Projections and MLPs stay one ragged batch. (A flat mask over the whole batch's keys would cost
  batch x total keys per row, quadratic in the batch size.)

A round after a long context splits (kernels/hybrid_attention.py); the specifications, in float64,
are in kernels/attention_reference.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specray.kernels.batch import RaggedBatch
from specray.kernels.hybrid_attention import HYBRID, SMALL_QUERY_ROWS, hybrid_attention


def ancestor_matrix(parents: list[int] | None, n: int) -> torch.Tensor:
    """[n, n] bool: entry (i, j) is True when new token j is token i or one of its ancestors."""
    if parents is None:
        return torch.ones(n, n, dtype=torch.bool).tril()
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def sequence_mask(context_len: int, parents: list[int] | None, n: int) -> torch.Tensor:
    """[n, context_len + n] bool: each new token sees the whole context and its own ancestry."""
    context = torch.ones(n, context_len, dtype=torch.bool)
    return torch.cat([context, ancestor_matrix(parents, n)], dim=1)


def is_causal_prefill(batch: RaggedBatch) -> bool:
    """One chain with no context: the mask is plain causal and the fused kernel can skip it."""
    return batch.is_single_chain() and batch.context_lens[0] == 0 and batch.num_tokens > SMALL_QUERY_ROWS


def build_attention_mask(batch: RaggedBatch) -> torch.Tensor | None:
    """[num_tokens, num_keys] bool block mask for the whole step; None when no mask is needed."""
    if (batch.is_single_chain() and batch.num_tokens == 1) or is_causal_prefill(batch):
        return None
    mask = torch.zeros(batch.num_tokens, batch.cu_keylens[-1], dtype=torch.bool)
    for b in range(batch.batch_size):
        q0, q1 = batch.cu_seqlens[b], batch.cu_seqlens[b + 1]
        k0, k1 = batch.cu_keylens[b], batch.cu_keylens[b + 1]
        pad = batch.key_pads[b] if batch.key_pads else 0
        mask[q0:q1, k0:k1 - pad] = sequence_mask(batch.context_lens[b], batch.parents[b], q1 - q0)
    return mask.to(batch.input_ids.device)


def ragged_attention(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     causal: bool = False, context_len: int | None = None) -> torch.Tensor:
    """Fast path for one sequence: hybrid (split) attention for a round after a long context, grouped
    bmm for few query rows, the fused SDPA kernel for prefill.

    q [num_tokens, num_heads, head_dim]; kv [2 * num_kv_heads, num_keys, head_dim] (keys, then values);
    mask [num_tokens, num_keys] or None; context_len: keys before the new tokens, which every row sees
    (None: unknown, no split) -> [num_tokens, num_heads * head_dim].
    """
    n = q.shape[0]
    if mask is not None and context_len is not None and HYBRID.applies(context_len, n):
        return hybrid_attention(q, kv, context_len, mask[:, context_len:context_len + n], scale)
    if q.shape[0] <= SMALL_QUERY_ROWS:
        return grouped_attention(q, kv, mask, scale)
    return fused_attention(q, kv, mask, scale, causal)


def grouped_attention(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """GQA as two bmm calls: the query heads that share a KV head are stacked as extra rows."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv.shape[0] // 2
    group = num_heads // num_kv_heads
    rows = q.view(num_tokens, num_kv_heads, group, head_dim).permute(1, 0, 2, 3)
    rows = rows.reshape(num_kv_heads, num_tokens * group, head_dim)  # [num_kv_heads, num_tokens * group, head_dim]
    scores = torch.bmm(rows, kv[:num_kv_heads].transpose(1, 2)) * scale  # [num_kv_heads, num_tokens * group, num_keys]
    if mask is not None:
        scores = scores.view(num_kv_heads, num_tokens, group, -1).masked_fill(
            ~mask.view(1, num_tokens, 1, -1), float("-inf")).view(num_kv_heads, num_tokens * group, -1)
    out = torch.bmm(scores.softmax(-1), kv[num_kv_heads:])  # [num_kv_heads, num_tokens * group, head_dim]
    return out.view(num_kv_heads, num_tokens, group, head_dim).permute(1, 0, 2, 3).reshape(num_tokens, -1)


def fused_attention(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None, scale: float,
                    causal: bool = False) -> torch.Tensor:
    """One fused SDPA call (flash kernel on CPU).

    q [num_tokens, num_heads, head_dim]; kv [2 * num_kv_heads, num_keys, head_dim] (keys, then values);
    mask [num_tokens, num_keys] or None -> [num_tokens, num_heads * head_dim].
    """
    num_kv_heads = kv.shape[0] // 2
    kv = kv.unsqueeze(0)  # 4-D inputs take the fused CPU kernel; 3-D ones fall back to the math path
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), kv[:, :num_kv_heads], kv[:, num_kv_heads:],
        attn_mask=mask, scale=scale, is_causal=causal, enable_gqa=q.shape[1] != num_kv_heads,
    )  # [1, num_heads, num_tokens, head_dim]
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


@dataclass
class SeqAttention:
    """One sequence of a multi-sequence step: its rows attend to its own keys only."""

    start: int  # its flat rows are start:end
    end: int
    keys: slice | torch.Tensor  # its cache slots: a slice when they are one ascending run (no gather)
    mask: torch.Tensor | None  # [rows, keys] bool; None: one row, or plain causal over no context
    causal: bool  # no context and many rows: the fused kernel's causal mode, no mask
    context_len: int | None = None  # keys every row sees before the new tokens; None: no hybrid split

    def __post_init__(self) -> None:
        assert self.end > self.start
        assert self.mask is None or self.mask.shape[0] == self.end - self.start


def seq_attention(batch: RaggedBatch, b: int) -> SeqAttention:
    q0, q1, k0, k1 = batch.cu_seqlens[b], batch.cu_seqlens[b + 1], batch.cu_keylens[b], batch.cu_keylens[b + 1]
    rows, ctx, parents = q1 - q0, batch.context_lens[b], batch.parents[b]
    slots = batch.key_slots[k0:k1]  # [keys]
    first = int(slots[0])
    run = slots.shape[0] == int(slots[-1]) - first + 1 and bool((slots[1:] > slots[:-1]).all())
    keys = slice(first, first + slots.shape[0]) if run else slots
    causal = parents is None and ctx == 0 and rows > SMALL_QUERY_ROWS and k1 - k0 == rows
    mask = None
    if not causal and (rows > 1 or parents is not None or k1 - k0 != ctx + rows):
        mask = torch.zeros(rows, k1 - k0, dtype=torch.bool)
        mask[:, :ctx + rows] = sequence_mask(ctx, parents, rows)  # padded-baseline dummy keys stay False
        mask = mask.to(batch.input_ids.device)
    return SeqAttention(q0, q1, keys, mask, causal, None if batch.key_pads else ctx)


@dataclass
class PaddedGroup:
    """Short sequences (decode, verification) of similar key counts, laid out per sequence and
    padded to the group's longest inside attention only: one batched matmul pair for them all."""

    key_slots: torch.Tensor  # [seqs * max_keys] cache slots (pads: a real key of the sequence, masked)
    query_index: torch.Tensor  # [seqs * max_rows] flat token row per padded query (pads: a real row, dropped)
    token_rows: torch.Tensor  # [tokens] flat rows these sequences hold
    token_index: torch.Tensor  # [tokens] padded query row of each of those rows
    mask: torch.Tensor  # [seqs, max_rows, max_keys] bool: key visible to query

    def __post_init__(self) -> None:
        seqs, max_rows, max_keys = self.mask.shape
        assert self.key_slots.shape == (seqs * max_keys,) and self.query_index.shape == (seqs * max_rows,)
        assert self.token_rows.shape == self.token_index.shape


@dataclass
class BatchAttention:
    """How a step of several sequences attends: built once per step, used by every layer."""

    num_tokens: int
    groups: list[PaddedGroup]
    singles: list[SeqAttention]  # long sequences (prefill chunks), and short ones with no similar peer

    def __post_init__(self) -> None:
        covered = sum(g.token_rows.shape[0] for g in self.groups) + sum(s.end - s.start for s in self.singles)
        assert covered == self.num_tokens, "every token attends exactly once"


PAD_WASTE = 1.25  # a group's padded keys may exceed its real keys by this factor


def padded_group(batch: RaggedBatch, seqs: list[int]) -> PaddedGroup:
    """Lay sequences `seqs` out per sequence: chains get a vectorised causal mask, trees their
    ancestor mask; the padded baseline's dummy keys stay masked."""
    dev = batch.input_ids.device
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=dev)  # noqa: E731
    q0, k0 = as_long([batch.cu_seqlens[b] for b in seqs]), as_long([batch.cu_keylens[b] for b in seqs])
    rows = as_long([batch.cu_seqlens[b + 1] - batch.cu_seqlens[b] for b in seqs])  # [seqs]
    keys = as_long([batch.cu_keylens[b + 1] - batch.cu_keylens[b] for b in seqs])  # [seqs]
    ctx = as_long([batch.context_lens[b] for b in seqs])  # [seqs]
    r, j = torch.arange(int(rows.max()), device=dev), torch.arange(int(keys.max()), device=dev)
    key_index = k0[:, None] + torch.minimum(j[None, :], keys[:, None] - 1)  # [seqs, max_keys]
    query_index = q0[:, None] + torch.minimum(r[None, :], rows[:, None] - 1)  # [seqs, max_rows]
    # chains: row r sees its context and new tokens 0..r; rows past the sequence see nothing
    mask = (j[None, None, :] <= ctx[:, None, None] + r[None, :, None]) & (r[None, :, None] < rows[:, None, None])
    for i, b in enumerate(seqs):
        if batch.parents[b] is not None:
            n, c = int(rows[i]), batch.context_lens[b]
            mask[i, :n, :c + n] = sequence_mask(c, batch.parents[b], n).to(dev)
    local = torch.arange(int(rows.sum()), device=dev) - torch.repeat_interleave(torch.cumsum(rows, 0) - rows, rows)
    token_rows = torch.repeat_interleave(q0, rows) + local
    token_index = torch.repeat_interleave(torch.arange(len(seqs), device=dev) * r.shape[0], rows) + local
    return PaddedGroup(batch.key_slots[key_index.reshape(-1)], query_index.reshape(-1), token_rows, token_index, mask)


def similar_key_groups(keys: dict[int, int]) -> list[list[int]]:
    """Sequences (id -> key count) grouped longest first, while padding stays within PAD_WASTE."""
    groups: list[list[int]] = []
    total = 0
    for b in sorted(keys, key=lambda b: -keys[b]):
        if groups and (len(groups[-1]) + 1) * keys[groups[-1][0]] <= PAD_WASTE * (total + keys[b]):
            groups[-1].append(b)
            total += keys[b]
        else:
            groups.append([b])
            total = keys[b]
    return groups


def plan_batch_attention(batch: RaggedBatch) -> BatchAttention:
    """Short sequences of similar lengths share one padded kernel call; a prefill chunk, or a short
    sequence with no similar peer, attends alone. Each query scores its own sequence's keys only."""
    rows = [b - a for a, b in zip(batch.cu_seqlens, batch.cu_seqlens[1:])]
    short = {b: batch.cu_keylens[b + 1] - batch.cu_keylens[b] for b, n in enumerate(rows) if n <= SMALL_QUERY_ROWS}
    groups, singles = [], [seq_attention(batch, b) for b, n in enumerate(rows) if n > SMALL_QUERY_ROWS]
    for g in similar_key_groups(short):
        if len(g) > 1:
            groups.append(padded_group(batch, g))
        else:
            singles.append(seq_attention(batch, g[0]))
    return BatchAttention(batch.num_tokens, groups, singles)


def padded_attention(q: torch.Tensor, kv: torch.Tensor, group: PaddedGroup, scale: float) -> torch.Tensor:
    """Grouped bmm over per-sequence padded keys.

    q [num_tokens, num_heads, head_dim] (the whole step); kv [2 * num_kv_heads, seqs * max_keys,
    head_dim] gathered at `group.key_slots` -> [len(group.token_rows), num_heads * head_dim].
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = kv.shape[0] // 2
    per_kv = num_heads // num_kv_heads
    seqs, rows, keys = group.mask.shape
    kv = kv.view(2 * num_kv_heads, seqs, keys, head_dim)  # a view: the batched matmuls read it in place
    qg = q.index_select(0, group.query_index).view(seqs, rows, num_kv_heads, per_kv, head_dim)
    qg = qg.permute(2, 0, 1, 3, 4).reshape(num_kv_heads, seqs, rows * per_kv, head_dim)
    scores = torch.matmul(qg, kv[:num_kv_heads].transpose(2, 3)) * scale  # [num_kv_heads, seqs, rows * per_kv, keys]
    scores = scores.view(num_kv_heads, seqs, rows, per_kv, keys).masked_fill(
        ~group.mask.view(1, seqs, rows, 1, keys), float("-inf"))
    out = torch.matmul(scores.view(num_kv_heads, seqs, rows * per_kv, keys).softmax(-1), kv[num_kv_heads:])
    out = out.view(num_kv_heads, seqs, rows, per_kv, head_dim).permute(1, 2, 0, 3, 4)  # [seqs, rows, heads...]
    # padded query rows (every key masked) are NaN; token_index never selects them
    return out.reshape(seqs * rows, num_heads * head_dim).index_select(0, group.token_index)


def batch_attention(q: torch.Tensor, layer_kv: torch.Tensor, plan: BatchAttention, scale: float) -> torch.Tensor:
    """Several sequences, each query over its own sequence's keys only: work linear in the keys
    (a flat mask over the whole batch's keys is quadratic in the batch size).

    q [num_tokens, num_heads, head_dim]; layer_kv [2 * num_kv_heads, num_slots, head_dim] (the cache
    layer) -> [num_tokens, num_heads * head_dim].
    """
    out = q.new_empty(plan.num_tokens, q.shape[1] * q.shape[2])
    for g in plan.groups:
        out.index_copy_(0, g.token_rows, padded_attention(q, layer_kv.index_select(1, g.key_slots), g, scale))
    for s in plan.singles:
        kv = layer_kv[:, s.keys] if isinstance(s.keys, slice) else layer_kv.index_select(1, s.keys)
        out[s.start:s.end] = ragged_attention(q[s.start:s.end], kv, s.mask, scale, s.causal, s.context_len)
    return out
