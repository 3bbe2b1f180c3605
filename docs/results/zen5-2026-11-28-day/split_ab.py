"""A verification step's cost with and without the hybrid split (exact kernels, SmolLM2-135M, one sequence after
`ctx` cached tokens, `rows` new ones), alternating step by step: a target (`row_invariant`) never splits,
the same model with `row_invariant` off splits where HYBRID says. python docs/results/zen5-2026-11-28-day/split_ab.py"""
import statistics
import time

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import load_model, resolve
model = load_model(resolve("smollm2-135m"), kernels="exact")
out = {}
for ctx in (2100, 4000):
    cache = model.make_cache((ctx + 64) // 16 + 2, 16)
    ids = [(i * 37) % 30000 + 5 for i in range(ctx)]
    for s in range(0, ctx, 512):
        model(RaggedBatch.build([SeqChunk("s", ids[s:s + 512], s)], cache), cache)
        cache.set_cached("s", min(ctx, s + 512))
    for rows in (1, 3, 4, 8):
        times = {True: [], False: []}
        for rep in range(40):
            for inv in (True, False):
                model.row_invariant = inv
                batch = RaggedBatch.build([SeqChunk("s", [11] * rows, ctx, num_logits=rows)], cache)
                t = time.perf_counter(); model(batch, cache); times[inv].append(time.perf_counter() - t)
                cache.set_cached("s", ctx)
        a, b = statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3
        print(f"ctx {ctx} rows {rows}: never split {a:.2f} ms, split {b:.2f} ms, split/never {b / a:.3f}", flush=True)
