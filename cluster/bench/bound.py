"""The speed limits `specray bench offline` compares each method with, measured in the same run.

- Memory: a decode step reads every weight byte once, so it takes at least weight_bytes over the
  memory bandwidth (the issue's bound).
- Arithmetic: the step's projections, run by the kernels the model uses with their weights already
  in cache, take `hot_gemv_s` however fast memory is. Where that exceeds the memory step, the box is
  compute-bound and no method reaches the memory bound; the roofline step is the larger of the two.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HOT_BYTES = 512 << 10  # a weight slice this size stays in L2 between calls (each core reads its share)


def best_seconds(run, repeats: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def gemv_bytes_per_s(model, repeats: int = 10) -> float:
    """One-row fp32 GEMVs (MKL) streaming every weight matrix of `model`: what a dense decode step reads."""
    mats = [p.detach() for p in {id(p): p for p in model.parameters()}.values() if p.dim() == 2]
    mats = [m for m in mats if m is not model.embed_tokens or model.config.tie_word_embeddings]
    xs = {m.shape[1]: torch.randn(1, m.shape[1], dtype=m.dtype) for m in mats}
    seconds = best_seconds(lambda: [F.linear(xs[m.shape[1]], m) for m in mats], repeats)
    return sum(m.numel() * m.element_size() for m in mats) / seconds


def stream_bytes_per_s(num_bytes: int = 256 << 20, repeats: int = 10) -> float:
    """A plain read: the max of a buffer far larger than the caches. On some CPUs MKL's GEMV streams
    at half of this, so a bound from the GEMV alone sits below what memory can really deliver."""
    buffer = torch.ones(num_bytes // 4, dtype=torch.int32)  # [num_bytes / 4]
    return num_bytes / best_seconds(lambda: buffer.max(), repeats)


def _hot_slice(model, weight: torch.Tensor):
    """-> (one-row call on the first rows of `weight` as the model stores them, fraction of it)."""
    from specray.kernels import cpu_kernels
    from specray.kernels.quant_linear import KINDS

    out, inp = weight.shape
    x = torch.randn(1, inp, dtype=weight.dtype)  # [1, in]
    packed = model.packed_weights.get(id(weight))
    if packed is not None:  # the C kernel itself: packed_linear's Python checks would dominate a slice
        rows = max(1, min(out, HOT_BYTES // packed.blocks[0].numel()))
        blocks = packed.blocks[:rows].contiguous()  # [rows, in / 32, block bytes]
        y = torch.empty(1, rows)  # [1, rows]
        lib = cpu_kernels.library()
        kind, threads = KINDS[packed.kind], torch.get_num_threads()
        # the closure holds x, blocks and y: the kernel gets raw pointers
        return (lambda: lib.specray_exact_linear(x.data_ptr(), 1, inp, blocks.data_ptr(), kind, rows, y.data_ptr(),
                                                 threads)), rows / out
    rows = max(1, min(out, HOT_BYTES // (inp * weight.element_size())))
    part = weight.detach()[:rows].contiguous()  # [rows, in]
    return (lambda: F.linear(x, part)), rows / out


def hot_gemv_seconds(model, repeats: int = 5, inner: int = 20) -> float:
    """Every projection of a one-row step with its weights in cache: each weight's first rows
    (HOT_BYTES) called `inner` times in a row, scaled up to the whole weight."""
    total = 0.0
    for weight in model.projections():
        call, fraction = _hot_slice(model, weight)
        seconds = best_seconds(lambda: [call() for _ in range(inner)], repeats) / inner
        total += seconds / fraction
    return total


@dataclass
class Bandwidth:
    """This run's memory bandwidth (read two ways; the bound uses the faster, the memory's real
    limit) and its arithmetic floor for a step's projections."""

    weight_bytes: int  # a decode step's weights at their packed size
    gemv_bytes_per_s: float
    stream_bytes_per_s: float
    hot_gemv_s: float | None = None  # the step's projections with weights in cache; None: not measured

    def __post_init__(self) -> None:
        assert self.weight_bytes > 0 and self.gemv_bytes_per_s > 0 and self.stream_bytes_per_s > 0
        assert self.hot_gemv_s is None or self.hot_gemv_s > 0

    @property
    def step_s(self) -> float:
        """The bound's step time: every weight byte read once at the best bandwidth seen."""
        return self.weight_bytes / max(self.gemv_bytes_per_s, self.stream_bytes_per_s)

    @property
    def roofline_step_s(self) -> float:
        """No step is faster than its memory reads nor than its projections' arithmetic."""
        return max(self.step_s, self.hot_gemv_s or 0.0)

    @property
    def limited_by(self) -> str:
        return "compute" if (self.hot_gemv_s or 0.0) > self.step_s else "memory"

    @classmethod
    def measure(cls, model) -> "Bandwidth":
        return cls(model.weight_bytes(), gemv_bytes_per_s(model), stream_bytes_per_s(), hot_gemv_seconds(model))
