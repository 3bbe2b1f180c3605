"""One-process A/B of the three kernel modes: a step at 1, 2 and 5 rows after 200 tokens, the modes interleaved (docs/performance.md, 2026-11-29 evening)."""
import time, statistics
from specray.kernels.loader import load_model, resolve
from specray.kernels.batch import RaggedBatch, SeqChunk
ctx = 200
models = {m: load_model(resolve("smollm2-135m"), kernels=m) for m in ("fast", "fast16", "exact")}
caches = {}
for m, model in models.items():
    c = model.make_cache(64 + ctx // 16, block_size=16)
    model(RaggedBatch.build([SeqChunk("s", list(range(100, 100 + ctx)), 0)], c), c)
    c.set_cached("s", ctx); caches[m] = c
def step(m, rows):
    model, c = models[m], caches[m]
    model(RaggedBatch.build([SeqChunk("s", [7] * rows, ctx, num_logits=rows)], c), c)
    c.set_cached("s", ctx)
for rows in (1, 2, 5):
    times = {m: [] for m in models}
    for rep in range(15):
        for m in models:
            for _ in range(3): step(m, rows)
            t = time.perf_counter()
            for _ in range(20): step(m, rows)
            times[m].append((time.perf_counter() - t) / 20 * 1e3)
    med = {m: statistics.median(v) for m, v in times.items()}
    print(f"rows {rows}: " + ", ".join(f"{m} {v:.2f} ms" for m, v in med.items()) + f"; fast16/fast {med['fast16']/med['fast']:.3f}, exact/fast16 {med['exact']/med['fast16']:.3f}")
