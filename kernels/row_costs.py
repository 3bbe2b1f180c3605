"""What a target step costs by the rows it holds, on this machine: the numbers the router's adaptive
speculation length weighs acceptance against (cluster/router/adaptive.py).

A verified draft token is one more row in the step. Where the weights' stream bounds a step (a CPU
at batch 1, an accelerator) a row is nearly free; where the arithmetic does, it costs up to a whole
step. Which one holds depends on the CPU, the kernels and the threads, so the costs are measured
once on the machine that serves (a few dozen forward steps) and cached per CPU model, model and
kernels, instead of constants tuned on one box.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specray.kernels import cpu_kernels
from specray.kernels.batch import RaggedBatch, SeqChunk

ROWS = 16  # rows measured: larger steps are extrapolated
CONTEXT = 128  # keys each measured row attends to (a short chat turn)
SCRATCH_SEQ = "__specray_row_costs__"
VERSION = 3  # of what is measured: a change re-measures every cached table


@dataclass(frozen=True)
class RowCosts:
    """seconds[r - 1]: one forward step holding r rows of one sequence."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        assert self.seconds and all(s > 0 for s in self.seconds), self.seconds
        assert all(a <= b for a, b in zip(self.seconds, self.seconds[1:])), "costs never fall with rows"

    def step_seconds(self, rows: int) -> float:
        """Seconds of a step of `rows` rows; linear past the measured table."""
        assert rows >= 1
        s = self.seconds
        if rows <= len(s):
            return s[rows - 1]
        slope = (s[-1] - s[-2]) if len(s) > 1 else s[0]
        return s[-1] + slope * (rows - len(s))

    def cost(self, rows: int) -> float:
        """A step of `rows` rows relative to a one-row step."""
        return self.step_seconds(rows) / self.seconds[0]

    def to_json(self) -> str:
        return json.dumps({"seconds": list(self.seconds)})

    @classmethod
    def from_json(cls, text: str) -> "RowCosts":
        return cls(tuple(float(x) for x in json.loads(text)["seconds"]))

    @classmethod
    def monotone(cls, seconds: list[float]) -> "RowCosts":
        """Timings made non-decreasing (a noisy longer step never counts as cheaper)."""
        out: list[float] = []
        for s in seconds:
            out.append(max(s, out[-1]) if out else s)
        return cls(tuple(out))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure(model, cache, rows: int | None = None, context: int = CONTEXT, repeats: int = 5) -> RowCosts:
    """Seconds of a forward step of 1..rows (default ROWS) rows after `context` cached tokens, the
    fastest of `repeats` interleaved passes (a shared machine's neighbours only ever add time, and
    the table is cached for good: a median kept a busy minute's costs, 2x a quiet one's), on a
    scratch sequence of `cache` that is freed afterwards. Writes no other sequence's KV."""
    capacity = cache.num_free_blocks * cache.block_size  # a small cache measures a shorter table
    rows = max(1, min(rows or ROWS, capacity // 2))
    context = max(1, min(context, capacity - rows))
    device = model.embed_tokens.device
    vocab = model.config.vocab_size
    tokens = [(7 * i + 3) % vocab for i in range(context + rows)]
    try:
        model(RaggedBatch.build([SeqChunk(SCRATCH_SEQ, tokens[:context], 0)], cache, device), cache)
        cache.set_cached(SCRATCH_SEQ, context)
        times: dict[int, list[float]] = {r: [] for r in range(1, rows + 1)}
        for _ in range(repeats + 1):  # the first pass warms every shape up; it is not kept
            for r in range(1, rows + 1):
                # every row's logits, as a verification step takes them
                chunk = SeqChunk(SCRATCH_SEQ, tokens[context:context + r], context, num_logits=r)
                batch = RaggedBatch.build([chunk], cache, device)
                _sync(device)
                start = time.perf_counter()
                model(batch, cache)
                _sync(device)
                times[r].append(time.perf_counter() - start)
    finally:
        cache.free(SCRATCH_SEQ)
    return RowCosts.monotone([min(times[r][1:]) for r in range(1, rows + 1)])


def cache_key(*parts: object) -> str:
    """A file name for these costs: the CPU kernels' build (sources, flags, CPU model), the GPU,
    the threads, and the setup's parts (model, kernels mode, dtype, device, ...)."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    text = "|".join(map(str, (VERSION, cpu_kernels.build_id(), gpu, torch.get_num_threads(), ROWS, CONTEXT, *parts)))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def stored_costs(key: str, cache_dir: Path) -> RowCosts | None:
    """The costs stored under `key`, or None."""
    try:
        return RowCosts.from_json((cache_dir / "row_costs" / f"{key}.json").read_text())
    except (OSError, ValueError, KeyError, AssertionError):
        return None


def store_costs(key: str, costs: RowCosts, cache_dir: Path) -> None:
    """Store `costs` under `key` (an unwritable cache only means measuring again next start)."""
    path = cache_dir / "row_costs" / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(costs.to_json())
        tmp.replace(path)
    except OSError:
        pass


def cached_costs(key: str, measure_now, cache_dir: Path, fresh: bool = False) -> RowCosts:
    """The costs stored under `key`, else (or with `fresh`) `measure_now()` stored there."""
    costs = None if fresh else stored_costs(key, cache_dir)
    if costs is None:
        costs = measure_now()
        store_costs(key, costs, cache_dir)
    return costs
