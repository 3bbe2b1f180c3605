"""CPU kernels on SmolLM2-135M: packed Q4_1/Q8_0 projections (exact and fast modes) vs MKL fp32,
and whole forward steps with the C kernels (every layer in one call, exact, fast16 or fast; or op by op from
Python) vs the torch paths, at the row counts of decode and verification, with each step's cost
relative to a one-row step (what a verification row costs).

    python benchmarks/cpu_kernels.py --rows 1,2,3,4,8,16,32 --out bench_out/cpu_kernels.json

Configurations run interleaved, repeat after repeat, and each figure is the median of its repeats,
so a noisy shared box moves all of them alike; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import load_model, resolve
from specray.kernels.fast_linear import fast_linear
from specray.kernels.quant_linear import packed_linear


def timed(fn, inner: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def projections(model, fast_model, rows: int, torch_paths: bool):
    """Every projection once, the packed kernels (exact, fast) vs MKL fp32 (x @ W^T), as a decode
    step reads them."""
    weights = model.projections()
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    packed = [(xs[w.shape[1]], model.packed_weights[id(w)]) for w in weights]
    fast = [(xs[w.shape[1]], fast_model.packed_weights[id(w)]) for w in fast_model.projections()]
    fp32 = [(xs[w.shape[1]], w.detach()) for w in weights]
    out = {"packed": lambda: [packed_linear(x, p) for x, p in packed],
           "fast": lambda: [fast_linear(x, p) for x, p in fast]}
    if torch_paths:
        out["fp32"] = lambda: [F.linear(x, w) for x, w in fp32]
    return out


def forward_steps(models: dict, rows: int, context: int = 200):
    """One sequence with `context` cached tokens bringing `rows` new ones (a decode step at 1 row,
    a verification step at k + 1), rolled back after each run; per config name -> (model, whether
    every layer runs in one C call)."""
    def step_fn(model, native: bool):
        cache = model.make_cache(64, block_size=16)
        model(RaggedBatch.build([SeqChunk("s", list(range(100, 100 + context)), 0)], cache), cache)
        cache.set_cached("s", context)

        def step():
            model.native_layers = native
            model(RaggedBatch.build([SeqChunk("s", [7] * rows, context, num_logits=rows)], cache), cache)
            cache.set_cached("s", context)
            model.native_layers = True
        return step
    return {name: step_fn(model, native) for name, (model, native) in models.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--inner", type=int, default=3)
    parser.add_argument("--out", default="bench_out/cpu_kernels.json")
    parser.add_argument("--no-torch", action="store_true", help="leave out MKL fp32 and the torch paths (slow)")
    args = parser.parse_args()
    model = load_model(resolve("smollm2-135m"), kernels="exact")  # C kernels on packed weights, transformers' numbers
    fast_model = load_model(resolve("smollm2-135m"), kernels="fast")
    fast16_model = load_model(resolve("smollm2-135m"), kernels="fast16")  # what `kernels: auto` runs this GGUF in
    plain = load_model(resolve("smollm2-135m"), cpu_kernels=False)  # torch paths, GEMV weight copies
    if not model.packed_weights:
        raise SystemExit("no packed weights: the C kernels are unavailable (no compiler?)")
    rows_list = [int(r) for r in args.rows.split(",")]
    suites = {("projections", r): projections(model, fast_model, r, not args.no_torch) for r in rows_list}
    # c_kernels: every layer in one C call (exact; c_kernels_fast16, c_kernels_fast: those modes);
    # c_ops: the same C kernels called op by op from Python
    models = {"c_kernels": (model, True), "c_kernels_fast16": (fast16_model, True), "c_kernels_fast": (fast_model, True),
              "c_ops": (model, False)}
    if not args.no_torch:
        models["torch"] = (plain, True)
    suites.update({("forward", r): forward_steps(models, r) for r in rows_list if r <= 16})
    times: dict[tuple, list[float]] = {}
    for _ in range(args.repeats):
        for (kind, rows), configs in suites.items():
            for name, fn in configs.items():
                times.setdefault((kind, rows, name), []).append(timed(fn, args.inner))
    results = [{"suite": k, "rows": r, "config": n, "median_ms": round(1e3 * statistics.median(v), 3)}
               for (k, r, n), v in times.items()]
    packed_bytes = sum(p.nbytes for p in model.packed_weights.values())
    fp32_bytes = sum(w.numel() * 4 for w in model.projections())
    report = {"machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "threads": torch.get_num_threads()},
              "bytes": {"packed": packed_bytes, "fp32": fp32_bytes}, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"projection bytes: packed {packed_bytes / 1e6:.1f} MB, fp32 {fp32_bytes / 1e6:.1f} MB")
    for kind, base, fast in (("projections", "fp32", "packed"), ("projections", "packed", "fast"),
                             ("forward", "torch", "c_kernels"), ("forward", "c_ops", "c_kernels"),
                             ("forward", "c_kernels", "c_kernels_fast16"), ("forward", "c_kernels", "c_kernels_fast")):
        for r in rows_list:
            a = statistics.median(times.get((kind, r, base), [0])) * 1e3
            b = statistics.median(times.get((kind, r, fast), [0])) * 1e3
            if a and b:
                print(f"{kind:11s} rows {r:2d}: {base} {a:7.2f} ms, {fast} {b:7.2f} ms, {a / b:.2f}x")
    for name in ("c_kernels", "c_kernels_fast16", "c_kernels_fast"):  # what a verification row costs
        one = statistics.median(times.get(("forward", 1, name), [0]))
        if one:
            ratios = {r: statistics.median(times[("forward", r, name)]) / one for r in rows_list
                      if ("forward", r, name) in times}
            print(f"cost(k rows) / cost(1 row), {name}: " + ", ".join(f"{r}: {v:.2f}" for r, v in ratios.items()))


if __name__ == "__main__":
    main()
