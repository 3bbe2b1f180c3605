"""Hybrid tree attention (LongSpec): a round's new tokens attend their sequence's context with no mask
(the prefix part, which returns its log-sum-exp) and the round's own tokens with the tree or causal
mask (the tree part); the two merge exactly by their log-sum-exps. `hybrid_reference_attention`
(kernels/attention_reference.py) specifies it; the single-sequence fast path and the C kernel split
where `HYBRID` says.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass

import torch

SMALL_QUERY_ROWS = 16  # up to this many query rows (decode, verify), grouped bmm beats the fused kernel


@dataclass
class HybridSplit:
    """Where verification attention splits into the prefix and the tree part. On a CPU the split
    saves context reads, not arithmetic, so it pays only after a long context: per path, sequences
    of `*_min_rows` to `torch_max_rows` new tokens after `*_min_context` context keys split; below,
    one masked pass is as fast or faster (benchmarks/hybrid_attention.py, docs/performance.md)."""

    c_min_context: int = 2048  # the C kernel
    c_min_rows: int = 3
    # A prefill chunk's hundreds of rows do not split: its tree part (the chunk's own keys, scored per
    # row) made a 256-row chunk's attention twice the one masked pass's (docs/performance.md).
    c_max_rows: int = SMALL_QUERY_ROWS
    torch_min_context: int = 4096  # the torch path (one sequence)
    torch_min_rows: int = 8
    torch_max_rows: int = 16  # more rows take the fused kernel, which the split only matches

    def __post_init__(self) -> None:
        assert min(self.c_min_context, self.torch_min_context) >= 1
        assert 2 <= self.torch_min_rows <= self.torch_max_rows and 2 <= self.c_min_rows <= self.c_max_rows

    def applies(self, context_len: int, rows: int) -> bool:
        """The torch path's rule."""
        return self.torch_min_rows <= rows <= self.torch_max_rows and context_len >= self.torch_min_context


ALWAYS_SPLIT = {"c_min_context": 1, "c_min_rows": 2, "c_max_rows": 1 << 30, "torch_min_context": 1,
                "torch_min_rows": 2, "torch_max_rows": 1 << 30}  # every round of 2+ rows after any context (tests, benchmark)
NEVER_SPLIT = {"c_min_context": 1 << 40, "torch_min_context": 1 << 40}  # one masked pass everywhere
HYBRID = HybridSplit()


@contextmanager
def hybrid_settings(**settings):
    """Change `HYBRID` for a block (e.g. `hybrid_settings(**ALWAYS_SPLIT)`), restored after."""
    old = dataclasses.asdict(HYBRID)
    for key, value in settings.items():
        setattr(HYBRID, key, value)
    try:
        yield HYBRID
    finally:
        for key, value in old.items():
            setattr(HYBRID, key, value)
FLASH_MIN_WORK = 1 << 16  # query rows x prefix keys from which the fused kernel beats bmm for the prefix part


def merge_parts(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over keys A and B from each part's normalised output [..., D] and log-sum-exp [...]:
    A's share of the total mass is sigmoid(lse_a - lse_b) (0 where A is empty: lse_a = -inf)."""
    w = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)  # [..., 1]
    return out_b + w * (out_a - out_b)


def prefix_part(rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [kv_heads, m, D] over every key, no mask: keys, values [kv_heads, ctx, D] -> the normalised
    output [kv_heads, m, D] and its log-sum-exp [kv_heads, m]."""
    if rows.shape[1] * keys.shape[1] >= FLASH_MIN_WORK:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            rows.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), 0.0, False, scale=scale)
        return out[0], lse[0]
    scores = torch.bmm(rows, keys.transpose(1, 2)) * scale  # [kv_heads, m, ctx]
    lse = scores.logsumexp(-1)  # [kv_heads, m]
    return torch.bmm((scores - lse.unsqueeze(-1)).exp(), values), lse


def tree_part(rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [kv_heads, m, D] over the round's own keys [kv_heads, n, D] where visible [m, n] -> the
    normalised output [kv_heads, m, D] and its log-sum-exp [kv_heads, m] (each row sees itself)."""
    scores = (torch.bmm(rows, keys.transpose(1, 2)) * scale).masked_fill(~visible, float("-inf"))
    lse = scores.logsumexp(-1)  # [kv_heads, m]
    return torch.bmm((scores - lse.unsqueeze(-1)).exp(), values), lse


def hybrid_attention(q: torch.Tensor, kv: torch.Tensor, context_len: int, tree_mask: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One sequence's round: q [n, num_heads, D]; kv [2 * num_kv_heads, >= context_len + n, D] (its
    context, then its new tokens); tree_mask [n, n] bool (ancestry) -> [n, num_heads * D]."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = kv.shape[0] // 2
    group = num_heads // num_kv_heads
    rows = q.view(n, num_kv_heads, group, head_dim).permute(1, 0, 2, 3).reshape(num_kv_heads, n * group, head_dim)
    keys, values = kv[:num_kv_heads], kv[num_kv_heads:]  # [num_kv_heads, keys, D]
    out_p, lse_p = prefix_part(rows, keys[:, :context_len], values[:, :context_len], scale)
    visible = tree_mask.repeat_interleave(group, dim=0)  # [n * group, n]: rows are (token, head in group)
    end = context_len + n
    out_t, lse_t = tree_part(rows, keys[:, context_len:end], values[:, context_len:end], visible, scale)
    out = merge_parts(out_p, lse_p, out_t, lse_t)  # [num_kv_heads, n * group, D]
    return out.view(num_kv_heads, n, group, head_dim).permute(1, 0, 2, 3).reshape(n, -1)
