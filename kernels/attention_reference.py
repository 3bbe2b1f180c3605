"""The specifications of attention over ragged batches, in float64: the fast paths
(kernels/attention.py, kernels/hybrid_attention.py, the C kernels) are held to these."""

from __future__ import annotations

import torch

from specray.kernels.attention import ancestor_matrix, sequence_mask
from specray.kernels.batch import RaggedBatch
from specray.kernels.hybrid_attention import merge_parts


def _per_sequence(q: torch.Tensor, kv: torch.Tensor, batch: RaggedBatch):
    """The references' view of a step, in float64: per sequence (its index, queries [num_heads, n, D],
    keys and values [num_heads, context + n, D], each KV head repeated for its query heads)."""
    assert batch.key_pads is None, "the reference does not model the padded baseline"
    num_kv_heads = kv.shape[0] // 2
    group = q.shape[1] // num_kv_heads
    for b in range(batch.batch_size):
        q0, q1, k0 = batch.cu_seqlens[b], batch.cu_seqlens[b + 1], batch.cu_keylens[b]
        k1 = k0 + batch.context_lens[b] + q1 - q0
        qs = q[q0:q1].double().transpose(0, 1)
        ks = kv[:num_kv_heads, k0:k1].double().repeat_interleave(group, dim=0)
        vs = kv[num_kv_heads:, k0:k1].double().repeat_interleave(group, dim=0)
        yield b, qs, ks, vs


def reference_attention(q: torch.Tensor, kv: torch.Tensor, batch: RaggedBatch, scale: float) -> torch.Tensor:
    """Specification: softmax(q k^T * scale + mask) v per sequence, computed in float64.

    q [num_tokens, num_heads, head_dim]; kv [2 * num_kv_heads, num_keys, head_dim].
    """
    outs = []
    for b, qs, ks, vs in _per_sequence(q, kv, batch):
        n = qs.shape[1]
        scores = qs @ ks.transpose(1, 2) * scale  # [num_heads, n, keys]
        scores = scores.masked_fill(~sequence_mask(batch.context_lens[b], batch.parents[b], n), float("-inf"))
        outs.append((scores.softmax(-1) @ vs).transpose(0, 1).reshape(n, -1))
    return torch.cat(outs).to(q.dtype)


def hybrid_reference_attention(q: torch.Tensor, kv: torch.Tensor, batch: RaggedBatch, scale: float) -> torch.Tensor:
    """Specification of the split, in float64: per sequence, the prefix part (every context key, no
    mask) and the tree part (the new tokens, ancestry mask), merged by their log-sum-exps.

    q [num_tokens, num_heads, head_dim]; kv [2 * num_kv_heads, num_keys, head_dim].
    """
    outs = []
    for b, qs, ks, vs in _per_sequence(q, kv, batch):
        ctx, n = batch.context_lens[b], qs.shape[1]
        prefix = qs @ ks[:, :ctx].transpose(1, 2) * scale  # [num_heads, n, ctx]
        tree = (qs @ ks[:, ctx:].transpose(1, 2) * scale).masked_fill(
            ~ancestor_matrix(batch.parents[b], n), float("-inf"))  # [num_heads, n, n]
        lse_p, lse_t = prefix.logsumexp(-1), tree.logsumexp(-1)  # [num_heads, n]; lse_p = -inf without context
        out_p = (prefix - lse_p.unsqueeze(-1)).exp().nan_to_num(0.0) @ vs[:, :ctx]
        out_t = (tree - lse_t.unsqueeze(-1)).exp() @ vs[:, ctx:]
        outs.append(merge_parts(out_p, lse_p, out_t, lse_t).transpose(0, 1).reshape(n, -1))
    return torch.cat(outs).to(q.dtype)
