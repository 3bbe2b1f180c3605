"""Verification attention per layer: one masked pass over context + round vs the hybrid split
(prefix part unmasked with its log-sum-exp, tree part masked, merged), SmolLM2-135M's shapes
(9 heads, 3 KV heads, head_dim 64), batch 1, for the torch path and the C kernel (<= 16 rows).

    python benchmarks/hybrid_attention.py --contexts 512,2048,8192 --rows 4,8,16,32,64 --out bench_out/hybrid.json

Pairs run interleaved, repeat after repeat; each figure is the median. The C kernel's single pass
is the split turned off (`NEVER_SPLIT`); the split is `ALWAYS_SPLIT`; the torch single pass is the
masked grouped bmm (<= 16 rows) or the masked fused kernel (more rows), as before the split.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from specray.kernels import cpu_kernels, cpu_ops
from specray.kernels.attention import build_attention_mask, ragged_attention
from specray.kernels.hybrid_attention import ALWAYS_SPLIT, NEVER_SPLIT, SMALL_QUERY_ROWS, hybrid_settings
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.config import ModelConfig
from specray.kernels.kv_cache import PagedKVCache

HEADS, KV_HEADS, DIM = 9, 3, 64


def timed(fn, inner: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def with_split(split: bool, fn):
    def run():
        with hybrid_settings(**(ALWAYS_SPLIT if split else NEVER_SPLIT)):
            return fn()
    return run


def case(ctx: int, rows: int, tree: bool):
    """-> {config name: callable} for one round of `rows` draft tokens after `ctx` context."""
    cfg = ModelConfig(vocab_size=8, hidden_size=HEADS * DIM, intermediate_size=8, num_layers=1, num_heads=HEADS,
                      num_kv_heads=KV_HEADS, head_dim=DIM, rms_norm_eps=1e-6, rope_theta=1e4,
                      max_position_embeddings=ctx + rows, tie_word_embeddings=True)
    cache = PagedKVCache(cfg, num_blocks=(ctx + rows) // 16 + 2, block_size=16)
    cache.kv.normal_()
    cache.reserve("s", ctx)
    cache.set_cached("s", ctx)
    rng = random.Random(ctx + rows)
    parents = [-1] + [rng.randrange(i) for i in range(1, rows)] if tree else None
    batch = RaggedBatch.build([SeqChunk("s", [1] * rows, ctx, parents, num_logits=rows)], cache)
    qkv = torch.randn(rows, HEADS + 2 * KV_HEADS, DIM)
    q = qkv[:, :HEADS].contiguous()
    kv = cache.kv[0][:, batch.key_range[0]:batch.key_range[1]]
    scale = DIM ** -0.5
    torch_path = lambda: ragged_attention(q, kv, build_attention_mask(batch), scale, context_len=ctx)  # noqa: E731
    configs = {"torch/single": with_split(False, torch_path), "torch/split": with_split(True, torch_path)}
    if cpu_kernels.available() and rows <= SMALL_QUERY_ROWS:
        c_path = lambda: cpu_ops.attention(qkv, HEADS, cache.kv[0], batch.key_slots,  # noqa: E731
                                           cpu_ops.AttentionRows.build(batch), scale)
        configs |= {"c/single": with_split(False, c_path), "c/split": with_split(True, c_path)}
    return configs


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="512,1024,2048,4096,8192", help="context lengths, comma-separated")
    ap.add_argument("--rows", default="4,8,16,32,64", help="draft tokens a round, comma-separated")
    ap.add_argument("--tree", action="store_true", help="random trees instead of chains")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats per pair (median reported)")
    ap.add_argument("--inner", type=int, default=20, help="calls timed per repeat")
    ap.add_argument("--out", default="bench_out/hybrid_attention.json", help="JSON results")
    args = ap.parse_args(argv)
    results = []
    for ctx in map(int, args.contexts.split(",")):
        for rows in map(int, args.rows.split(",")):
            configs = case(ctx, rows, args.tree)
            times: dict[str, list[float]] = {name: [] for name in configs}
            for _ in range(args.repeats):
                for name, fn in configs.items():
                    times[name].append(timed(fn, args.inner))
            row = {"context": ctx, "rows": rows} | {f"{n}_us": statistics.median(t) * 1e6 for n, t in times.items()}
            for path in ("torch", "c"):
                if f"{path}/split_us" in row:
                    row[f"{path}_speedup"] = row[f"{path}/single_us"] / row[f"{path}/split_us"]
            results.append(row)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    out = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "tree": args.tree, "rows": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
