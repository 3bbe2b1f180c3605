"""DiffusionWorker: owns a diffusion LM and every running sequence's canvas; one model call a step."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from specray.actors.specs import DiffusionSpec
from specray.kernels.diffusion.decoding import CanvasPlan, DecodeOptions, StepSampler
from specray.kernels.diffusion.engine import DiffusionEngine, DiffusionUpdate
from specray.kernels.diffusion.model import DiffusionModel
from specray.kernels.diffusion.weights import load_diffusion_model
from specray.kernels.loader import DTYPES, resolve
from specray.kernels.sampling import SamplingConfig


@dataclass(frozen=True)
class DiffusionItem:
    """A sequence to start decoding: what the router sends the worker once."""

    seq_id: object
    prompt_token_ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    seed: int | None  # None: drawn here (a sampled request without a seed)
    stop_token_ids: frozenset[int]  # a finalized block holding one ends the sequence's decoding

    def __post_init__(self) -> None:
        assert self.prompt_token_ids and self.max_tokens >= 1


class DiffusionWorker:
    """Plain class; Ray places it in cluster/. Usable in-process."""

    def __init__(self, model: DiffusionModel, options: DecodeOptions):
        self.model, self.options = model, options
        self.engine = DiffusionEngine(model, options)
        self.busy_seconds = 0.0  # wall time inside step()

    @classmethod
    def from_spec(cls, spec: DiffusionSpec) -> "DiffusionWorker":
        torch.set_num_threads(spec.threads or len(os.sched_getaffinity(0)))
        model = load_diffusion_model(resolve(spec.model).path, DTYPES[spec.dtype], spec.device)
        return cls(model, DecodeOptions(spec.block_length, spec.steps_per_block, spec.num_drafts, spec.adaptive))

    def plan(self, prompt_len: int, max_tokens: int) -> CanvasPlan:
        return CanvasPlan.for_request(prompt_len, max_tokens, self.options)

    def step(self, new: list[DiffusionItem], seq_ids: list[object]) -> list[DiffusionUpdate]:
        """Start the `new` sequences, then one model call for `seq_ids` (new ones included). A call
        that raises holds nothing it started and changed no canvas: the router may retry it."""
        start, added = time.perf_counter(), []
        try:
            for item in new:
                seed = _draw_seed() if item.seed is None else item.seed
                sampler = StepSampler(item.sampling, seed, self.model.config.mask_token_id)
                self.engine.add(item.seq_id, item.prompt_token_ids,
                                self.plan(len(item.prompt_token_ids), item.max_tokens), sampler, item.stop_token_ids)
                added.append(item.seq_id)
            return self.engine.step(seq_ids)
        except Exception:
            for seq_id in added:
                self.engine.release(seq_id)
            raise
        finally:
            self.busy_seconds += time.perf_counter() - start

    def release(self, seq_id: object) -> None:
        self.engine.release(seq_id)

    def busy(self) -> float:
        return self.busy_seconds

    def ready(self) -> bool:
        return True

    def ping(self) -> bool:
        return True


def _draw_seed() -> int:
    """An unseeded request's seed, from torch's generator: `LLM(seed=...)` seeds it, as it does every
    autoregressive draw (Python's `random` left such runs different every time)."""
    return int(torch.randint(0, 2**62, (1,)).item())
