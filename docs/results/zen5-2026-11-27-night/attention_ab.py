"""A decode row's attention alone, one KV layer, warm: kernels/csrc of commit BASE against the working tree,
alternating in one process (throwaway probe, 2026-11-27 night).

    python attention_ab.py BASE CONTEXT THREADS [ROWS]
"""
import statistics, subprocess, sys, tempfile, time, ctypes
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from kernel_ab import build, REPO
from specray.kernels import cpu_kernels, cpu_ops
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import load_model, resolve

base = sys.argv[1]; ctx = int(sys.argv[2]); nt = int(sys.argv[3]); rows_n = int(sys.argv[4]) if len(sys.argv) > 4 else 1
def sources(rev):
    out = {}
    for p in cpu_kernels.SOURCES + sorted((REPO / "kernels/csrc").glob("*.h")):
        rel = p.relative_to(REPO)
        out[p.name] = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{rel}"], capture_output=True, check=True).stdout if rev else p.read_bytes()
    return out
libs = {"base": build(sources(base), Path(tempfile.mkdtemp()) / "base"), "new": build(sources(None), Path(tempfile.mkdtemp()) / "new")}
torch.set_num_threads(nt)
model = load_model(resolve("smollm2-135m"), kernels="fast")
cache = model.make_cache(64 + ctx // 16 + 2, block_size=16)
model(RaggedBatch.build([SeqChunk("s", list(range(100, 100 + ctx)), 0)], cache), cache)
cache.set_cached("s", ctx)
batch = RaggedBatch.build([SeqChunk("s", [7] * rows_n, ctx, num_logits=rows_n)], cache)
rows = cpu_ops.AttentionRows.build(batch)
qkv = torch.randn(rows_n, 15, 64)
P = cpu_ops._ptr
outs = {k: torch.empty(rows_n, 9 * 64) for k in libs}
scratch = torch.empty(10_000_000)
kv = cache.kv[0]
args = (P(qkv), 15 * 64, rows_n, 9, 3, 64, P(kv), kv.shape[1], P(batch.key_slots), P(rows.key_start), P(rows.num_ctx), P(rows.num_new), P(rows.num_pad), P(rows.new_mask), rows.new_mask.shape[1], ctypes.c_float(model.scale))
for lib in libs.values():
    lib.specray_set_attention_split(10**9, 10**9, 10**9)
times = {k: [] for k in libs}
for rep in range(40):
    for k, lib in libs.items():
        f = lib.specray_attention_f16
        t = time.perf_counter()
        for _ in range(200):
            f(*args, P(outs[k]), P(scratch), rows.max_keys, nt)
        times[k].append((time.perf_counter() - t) / 200 * 1e6)
print(f"ctx {ctx} threads {nt} rows {rows_n}: base {statistics.median(times['base']):.2f} us, new {statistics.median(times['new']):.2f} us, equal {torch.equal(outs['base'], outs['new'])}")
