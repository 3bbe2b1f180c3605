"""What a worker needs to build itself inside its own process (a Ray actor or in-process)."""

from __future__ import annotations

from dataclasses import dataclass

from specray.kernels.kernel_modes import check_kernel_setting
from specray.kernels.drafters.options import DraftOptions


@dataclass(frozen=True)
class TargetSpec:
    model: str
    dtype: str = "float32"
    device: str = "cpu"
    num_blocks: int = 1024
    block_size: int = 16
    threads: int | None = None  # torch intra-op threads; None: the node's cores / tp_size
    # Tensor parallelism: this worker is rank tp_rank of tp_size workers sharing one target. Every
    # rank must receive every step/release call, in the same order; all return the same results.
    tp_rank: int = 0
    tp_size: int = 1
    dist_init_method: str | None = None  # e.g. "tcp://10.0.0.5:29500" (rank 0's host); None: "env://"
    dist_backend: str | None = None  # None: "nccl" on a cuda device, else "gloo"
    kernels: str = "exact"  # the packed CPU kernels' numeric mode, or auto (kernels/kernel_modes.py)
    enable_prefix_caching: bool = False  # share full KV blocks of equal prefixes (kernels/prefix_cache.py)

    def __post_init__(self) -> None:
        assert self.num_blocks >= 1 and self.block_size >= 1
        check_kernel_setting(self.kernels)
        if not (self.tp_size >= 1 and 0 <= self.tp_rank < self.tp_size):
            raise ValueError(f"need tp_size >= 1 and 0 <= tp_rank < tp_size, got rank {self.tp_rank} "
                             f"of {self.tp_size}")
        if self.dist_backend not in (None, "gloo", "nccl"):
            raise ValueError(f"dist_backend must be 'gloo', 'nccl' or None, got {self.dist_backend!r}")


@dataclass(frozen=True)
class DraftSpec(DraftOptions):
    """A drafter's options (kernels/drafters/options.py), the worker's threads, and its rank in a
    layer-parallel draft group (EasySpec across devices; every rank receives every call)."""

    threads: int | None = None  # torch intra-op threads; None: torch's default
    group_rank: int = 0
    group_size: int = 1
    dist_init_method: str | None = None  # rank 0's tcp:// rendezvous; None: "env://"
    dist_backend: str | None = None  # None: "nccl" on a cuda device, else "gloo"


@dataclass(frozen=True)
class DiffusionSpec:
    """A diffusion LM worker: the model and how it decodes (FreeDave with num_drafts > 1)."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    block_length: int = 32
    steps_per_block: int | None = None  # None: block_length
    num_drafts: int = 4
    threads: int | None = None  # torch intra-op threads; None: the node's cores
    adaptive: bool = True  # each sequence's drafts a round chosen up to num_drafts
