"""The fast mode's fp16 KV cache against an fp32 one: forward steps of the same fast-mode SmolLM2-135M
over two caches holding the same tokens, interleaved in one process (this box's load moves both alike).

Each case is `seqs` sequences after `context` cached tokens stepping `rows` new tokens each (a decode
step at 1, a verification chain at k + 1). Prints milliseconds a step for each cache, fp32 / fp16,
and how far the two caches' logits are apart (top-1 agreement over the step's rows, largest logit
difference).

    python benchmarks/kv_cache_dtype.py --cases 1x200x1,1x1000x1,1x2000x1,1x200x4,8x300x1,16x200x1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def parse_cases(text: str) -> list[tuple[int, int, int]]:
    """"SEQSxCONTEXTxROWS,..." -> [(seqs, context, rows)]."""
    cases = [tuple(int(x) for x in part.split("x")) for part in text.split(",")]
    assert all(len(c) == 3 and min(c) >= 1 for c in cases), f"cases are SEQSxCONTEXTxROWS, got {text!r}"
    return cases


def prefilled(model, dtype: torch.dtype, seqs: int, context: int):
    from specray.kernels.batch import RaggedBatch, SeqChunk
    from specray.kernels.kv_cache import PagedKVCache

    cache = PagedKVCache(model.shard_config, seqs * (context // 16 + 4), 16, dtype=dtype)
    for s in range(seqs):  # the same tokens in both caches
        tokens = [(100 + 7 * i + 13 * s) % model.config.vocab_size for i in range(context)]
        model(RaggedBatch.build([SeqChunk(s, tokens, 0)], cache), cache)
        cache.set_cached(s, context)
    return cache


def step(model, cache, seqs: int, context: int, rows: int) -> torch.Tensor:
    """One step of every sequence; its new tokens are dropped after it. -> logits [seqs * rows, vocab]."""
    from specray.kernels.batch import RaggedBatch, SeqChunk

    chunks = [SeqChunk(s, [(7 + r) % model.config.vocab_size for r in range(rows)], context, num_logits=rows)
              for s in range(seqs)]
    logits = model(RaggedBatch.build(chunks, cache), cache)
    for s in range(seqs):
        cache.set_cached(s, context)
    return logits


def measure(model, case: tuple[int, int, int], repeats: int, steps: int) -> dict:
    seqs, context, rows = case
    caches = {"fp32": prefilled(model, torch.float32, seqs, context),
              "fp16": prefilled(model, torch.float16, seqs, context)}
    a, b = (step(model, caches[k], seqs, context, rows) for k in ("fp32", "fp16"))
    times: dict[str, list[float]] = {k: [] for k in caches}
    for _ in range(repeats):
        for name, cache in caches.items():
            start = time.perf_counter()
            for _ in range(steps):
                step(model, cache, seqs, context, rows)
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    ms = {k: statistics.median(v) for k, v in times.items()}
    return {"seqs": seqs, "context": context, "rows": rows, "ms_fp32": round(ms["fp32"], 3),
            "ms_fp16": round(ms["fp16"], 3), "fp32_over_fp16": round(ms["fp32"] / ms["fp16"], 3),
            "top1_agreement": round((a.argmax(-1) == b.argmax(-1)).float().mean().item(), 3),
            "max_logit_difference": round((a - b).abs().max().item(), 3)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a GGUF model (name or folder)")
    parser.add_argument("--cases", default="1x200x1,1x1000x1,1x2000x1,1x200x4,8x300x1,16x200x1",
                        help="SEQSxCONTEXTxROWS, comma-separated")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved timings per cache and case")
    parser.add_argument("--steps", type=int, default=5, help="steps per timing")
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    from specray.kernels.loader import load_model, resolve

    model = load_model(resolve(args.model), kernels="fast")
    assert model.kv_dtype == torch.float16, "the fast mode needs the C kernels (a C compiler)"
    results = []
    for case in parse_cases(args.cases):
        r = measure(model, case, args.repeats, args.steps)
        results.append(r)
        print(f"{r['seqs']} seqs x {r['context']} cached, {r['rows']} rows: fp32 {r['ms_fp32']:.2f} ms, "
              f"fp16 {r['ms_fp16']:.2f} ms, {r['fp32_over_fp16']:.3f}x; top-1 agreement "
              f"{r['top1_agreement']:.2f}, largest logit difference {r['max_logit_difference']:.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
