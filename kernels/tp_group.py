"""The collectives a tensor-parallel forward calls (kernels/tensor_parallel.py implements them)."""

from __future__ import annotations

import torch


class TPGroup:
    """The collectives a tensor-parallel forward calls. This base is a single rank: both are identity.

    `kernels/tensor_parallel.py` holds the torch.distributed and in-process (threads) groups.
    """

    rank: int = 0
    size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks (may reuse x); every rank must get the same bits back."""
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., size * n], rank 0's slice first."""
        return x
