"""Where a SmolLM2-135M forward step's time goes, phase by phase, against the memory floor.

Builds the C kernels with -DSPECRAY_PHASE_TIMES (a separate library in the kernel cache: the
decoder then sums each layer phase's nanoseconds), runs forward steps of one sequence after
`--context` tokens with `--rows` new ones (a decode step at 1, verification at k + 1) and prints
microseconds a layer for each phase, the decoder call, the rest of the step (final norm, head,
sampling-free Python), of which the step's inputs (`RaggedBatch.build` and `AttentionRows.build`,
timed inside the step loop, where the weights' stream has evicted Python's caches), and the step
against the floor of its weight bytes over the plain memory read. A shared box moves both by tens of
per cent within minutes, so the steps run in `--blocks` blocks, each right after its own plain read
(the best of three), and floor / step is the median over blocks of each block's own ratio.

    python benchmarks/decoder_phases.py --kernels fast --rows 1,4 --context 200
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time

from specray.kernels.kernel_modes import KERNEL_MODES

PHASES = ["qkv", "rope", "attention", "o_proj", "post_norm", "gate_up", "silu", "down", "next_norm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", choices=list(KERNEL_MODES), default="fast", help="the model's numeric mode")
    parser.add_argument("--rows", default="1", help="new tokens a step, comma-separated")
    parser.add_argument("--context", type=int, default=200, help="cached tokens before the step")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per row count")
    parser.add_argument("--blocks", type=int, default=6, help="plain reads interleaved with the timed steps")
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    from specray.kernels import cpu_kernels

    flags = os.environ.get(cpu_kernels.FLAGS_ENV, "")
    os.environ[cpu_kernels.FLAGS_ENV] = f"{flags} -DSPECRAY_PHASE_TIMES".strip()
    from specray.cluster.bench.bound import stream_bytes_per_s
    from specray.kernels import cpu_ops
    from specray.kernels.batch import RaggedBatch, SeqChunk
    from specray.kernels.loader import load_model, resolve

    lib = cpu_kernels.library()
    if lib is None:
        raise SystemExit("no C kernels (no compiler?)")
    phase_ns = (ctypes.c_double * len(PHASES)).in_dll(lib, "specray_phase_ns")
    model = load_model(resolve("smollm2-135m"), kernels=args.kernels)
    layers = model.config.num_layers
    report = {"kernels": args.kernels, "context": args.context, "weight_mb": model.weight_bytes() / 1e6, "rows": {}}
    print(f"{args.kernels} kernels, context {args.context}: weights {model.weight_bytes() / 1e6:.1f} MB")
    for rows in [int(r) for r in args.rows.split(",")]:
        cache = model.make_cache(64 + (args.context + rows) // 16, block_size=16)
        model(RaggedBatch.build([SeqChunk("s", list(range(100, 100 + args.context)), 0)], cache), cache)
        cache.set_cached("s", args.context)

        inputs_s = [0.0]
        build_rows = cpu_ops.AttentionRows.build

        def timed_rows(*a, **k):
            t = time.perf_counter()
            out = build_rows(*a, **k)
            inputs_s[0] += time.perf_counter() - t
            return out

        def step():
            t = time.perf_counter()
            batch = RaggedBatch.build([SeqChunk("s", [7] * rows, args.context, num_logits=rows)], cache)
            inputs_s[0] += time.perf_counter() - t
            model(batch, cache)
            cache.set_cached("s", args.context)

        cpu_ops.AttentionRows.build = timed_rows

        for _ in range(10):
            step()
        for i in range(len(PHASES)):
            phase_ns[i] = 0.0
        inputs_s[0] = 0.0
        per_block = max(1, args.steps // args.blocks)
        blocks = []  # (floor ms by this block's plain read, ms a step in the block)
        for _ in range(args.blocks):
            floor_ms = model.weight_bytes() / stream_bytes_per_s(repeats=3) * 1e3
            start = time.perf_counter()
            for _ in range(per_block):
                step()
            blocks.append((floor_ms, (time.perf_counter() - start) / per_block * 1e3))
        steps = per_block * args.blocks
        step_ms = statistics.fmean(b[1] for b in blocks)  # blocks of equal size: the mean step
        floor_ratio = statistics.median(f / ms for f, ms in blocks)
        cpu_ops.AttentionRows.build = build_rows
        inputs_us = inputs_s[0] / steps * 1e6
        per_layer_us = {name: phase_ns[i] / steps / layers / 1e3 for i, name in enumerate(PHASES)}
        decoder_ms = sum(per_layer_us.values()) * layers / 1e3
        report["rows"][rows] = {"step_ms": step_ms, "decoder_ms": decoder_ms, "inputs_us": inputs_us,
                                "per_layer_us": per_layer_us, "floor_over_step": floor_ratio,
                                "blocks": [{"floor_ms": f, "step_ms": ms} for f, ms in blocks]}
        floors = sorted(f for f, _ in blocks)
        print(f"rows {rows}: step {step_ms:.2f} ms (floor / step {floor_ratio:.2f}, the floor "
              f"{floors[0]:.2f}-{floors[-1]:.2f} ms over {args.blocks} blocks), decoder "
              f"{decoder_ms:.2f} ms, the rest (final norm, head, Python) {step_ms - decoder_ms:.2f} ms, of "
              f"which the step's inputs {inputs_us:.0f} us")
        print("  us a layer: " + ", ".join(f"{name} {us:.1f}" for name, us in per_layer_us.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
