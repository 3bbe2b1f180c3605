"""The random choices a tree verification rule makes, behind one small interface.

Rules ask for Bernoulli and categorical draws, never raw uniforms, so that a test can replace
`GeneratorDraws` with a source that enumerates every outcome with its exact probability.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specray.kernels.sampling import sample_rows


class Draws(Protocol):
    def bernoulli(self, prob: float) -> bool:
        """True with probability `prob` (clamped to [0, 1])."""
        ...

    def categorical(self, weights: torch.Tensor) -> int:
        """weights [n] (unnormalised, >= 0) -> an index drawn proportionally."""
        ...


class GeneratorDraws:
    """Draws from one torch.Generator (None: the global RNG). Each draw is a host sync; the tree
    rules are a per-node walk on the host anyway."""

    def __init__(self, generator: torch.Generator | None):
        self.generator = generator

    def bernoulli(self, prob: float) -> bool:
        return bool(torch.rand(1, generator=self.generator, dtype=torch.float64).item() < prob)

    def categorical(self, weights: torch.Tensor) -> int:
        return int(sample_rows(weights.reshape(1, -1).cpu(), self.generator)[0])
