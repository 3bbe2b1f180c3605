"""What the row-invariant (fixed-shape) torch path costs against the library kernels' path: torch
ops a step that compute (each a kernel launch on a GPU, where a 135M-parameter step is bound by launches) and
milliseconds a step, for a decode row, a 5-row verification, 8 sequences decoding and a 200-token
prefill, all after 300 tokens of context.

    python benchmarks/invariant_ops.py --device cpu --dtype float16
    python benchmarks/invariant_ops.py --device cuda --dtype float16   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import load_model, resolve

CONTEXT = 300


class CountOps(TorchDispatchMode):
    """Counts the torch ops that compute (views launch nothing)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view
        return func(*args, **(kwargs or {}))


def shapes() -> dict[str, list[SeqChunk]]:
    return {"decode 1 row": [SeqChunk(0, [7], CONTEXT)],
            "verify 5 rows": [SeqChunk(0, [7, 8, 9, 10, 11], CONTEXT, num_logits=5)],
            "8 sequences decoding": [SeqChunk(s, [7], CONTEXT) for s in range(8)],
            "prefill 200": [SeqChunk(8, list(range(100, 300)), 0)]}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(model, chunks: list[SeqChunk], device: str, repeats: int) -> dict:
    cache = model.make_cache(256, block_size=16)
    for s in range(9):
        model(RaggedBatch.build([SeqChunk(s, list(range(10, 10 + CONTEXT)), 0)], cache, device), cache)
        cache.set_cached(s, CONTEXT)
    cache.free(8)

    def step():
        for c in chunks:  # back to the context: drop what the last step wrote
            if c.context_len:
                cache.set_cached(c.seq_id, c.context_len)
            else:
                cache.free(c.seq_id)
        model(RaggedBatch.build(chunks, cache, device), cache)

    with CountOps() as counter:
        step()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return {"ops": counter.ops, "ms": round(statistics.median(times), 3)}


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    model = load_model(resolve(args.model), dtype=getattr(torch, args.dtype), device=args.device)
    out = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu", "dtype": args.dtype}
    for name, chunks in shapes().items():
        row = {}
        for label, fixed in (("library", False), ("fixed", True)):
            model.row_invariant, model.gemv_weights = fixed, {}
            if not fixed and args.device == "cpu":
                model.add_gemv_weights()  # the library path as drafts run it: GEMV copies for one row
            row[label] = measure(model, chunks, args.device, args.repeats)
        row["ops_ratio"] = round(row["fixed"]["ops"] / row["library"]["ops"], 2)
        row["ms_ratio"] = round(row["fixed"]["ms"] / row["library"]["ms"], 2)
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


if __name__ == "__main__":
    main()
