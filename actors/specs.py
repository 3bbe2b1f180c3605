"""What a worker needs to build itself inside its own process (a Ray actor or in-process)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetSpec:
    model: str
    dtype: str = "float32"
    device: str = "cpu"
    num_blocks: int = 1024
    block_size: int = 16
    threads: int | None = None  # torch intra-op threads inside the worker process

    def __post_init__(self) -> None:
        assert self.num_blocks >= 1 and self.block_size >= 1


@dataclass(frozen=True)
class DraftSpec:
    method: str  # "ngram" | "draft_model"
    model: str | None = None
    num_layers: int | None = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    dtype: str = "float32"
    device: str = "cpu"
    num_blocks: int = 1024
    threads: int | None = None
