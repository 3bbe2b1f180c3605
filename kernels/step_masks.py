"""Which new tokens each query row of a step sees (the C attention's `new_mask`, `cpu_ops.AttentionRows`).

`visible_new` is the reference, one sequence at a time (`ancestor_matrix`, zero-padded);
`new_token_mask` builds the whole step's rows at once and is held to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specray.kernels.attention import ancestor_matrix

# A row's visible new tokens as one int64's bits: up to this many new tokens a sequence
MASK_BITS = 62


def new_token_mask(parents: list[list[int] | None], counts: list[int], width: int) -> torch.Tensor:
    """uint8 [sum(counts), width]: `visible_new` of every sequence, stacked. Up to MASK_BITS new tokens
    a row's ancestry is a Python int's bits, expanded by one shift for the whole step: a tensor op or
    two per sequence cost a 512-sequence step more than its attention."""
    if width == 1:  # decode steps: every row sees its one new token
        return torch.ones(sum(counts), 1, dtype=torch.uint8)
    if width > MASK_BITS:  # long prefill chunks: a few sequences, one tril each
        return torch.cat([visible_new(p, n, width) for p, n in zip(parents, counts)])
    bits: list[int] = []
    for p, n in zip(parents, counts):
        bits += ancestry_bits(p, n)
    return ((torch.tensor(bits)[:, None] >> torch.arange(width)) & 1).to(torch.uint8)


def ancestry_bits(parents: list[int] | None, n: int) -> list[int]:
    """Row i's visible new tokens (itself and its ancestors; a chain's: 0..i) as the bits of an int.
    Rows past `parents` (padded-baseline dummies) see themselves only, as `ancestor_matrix`'s."""
    if parents is None:
        return [(2 << i) - 1 for i in range(n)]
    bits: list[int] = []
    for i in range(n):
        p = parents[i] if i < len(parents) else -1
        bits.append((bits[p] if p >= 0 else 0) | 1 << i)
    return bits


def visible_new(parents: list[int] | None, n: int, width: int) -> torch.Tensor:
    """`ancestor_matrix(parents, n)` as uint8 [n, width], each row zero-padded to `width`: new token
    j is visible to row i where it is i or one of i's ancestors (a chain: j <= i)."""
    if parents is None:  # a prefill chunk or a chain: one tensor op, not n * width Python ints
        return torch.ones(n, width, dtype=torch.uint8).tril()
    return F.pad(ancestor_matrix(parents, n).to(torch.uint8), (0, width - n))
