"""A one-row (or k-row) SmolLM2-135M step with the final norm and head in one C call
(`cpu_ops.decoder_logits`) against the model's separate norm and head calls, alternating blocks of
steps in one process; prints the median ms a step of each and their ratio.

    python docs/results/probes-2026-11-26-late/fused_head_ab.py --kernels fast --rows 1,4
"""

import argparse
import statistics
import time

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import load_model, resolve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", choices=["exact", "fast"], default="fast")
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--steps", type=int, default=50, help="steps a block")
    args = ap.parse_args()
    model = load_model(resolve("smollm2-135m"), kernels=args.kernels)
    fused_head = model.packed_head
    for rows in [int(r) for r in args.rows.split(",")]:
        cache = model.make_cache(64 + (args.context + rows) // 16, block_size=16)
        model(RaggedBatch.build([SeqChunk("s", list(range(100, 100 + args.context)), 0)], cache), cache)
        cache.set_cached("s", args.context)

        def block(fused: bool) -> float:
            model.packed_head = fused_head if fused else (lambda: None)
            start = time.perf_counter()
            for _ in range(args.steps):
                model(RaggedBatch.build([SeqChunk("s", [7] * rows, args.context, num_logits=rows)], cache), cache)
                cache.set_cached("s", args.context)
            return (time.perf_counter() - start) / args.steps * 1e3

        block(True), block(False)
        times = {True: [], False: []}
        for _ in range(args.blocks):
            for fused in (False, True):
                times[fused].append(block(fused))
        separate, fused = statistics.median(times[False]), statistics.median(times[True])
        print(f"{args.kernels}, rows {rows}: separate {separate:.3f} ms, one call {fused:.3f} ms, {separate / fused:.3f}x")
    model.packed_head = fused_head


if __name__ == "__main__":
    main()
