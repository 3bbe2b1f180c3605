"""What a Hugging Face checkpoint's target costs a step on the CPU: its weights packed as their own
values (bf16 or fp32 blocks through the C kernels), against MKL on the fp32 weights with one-row
GEMV copies (the library path: rows vary with the step) and in fixed 16-row chunks (row-invariant
torch). SmolLM2-135M's GGUF values stand in for a checkpoint: rounded to bf16 (`--values bf16`, what
most checkpoints hold) or nudged off every grid (`--values f32`). Milliseconds a step, median.

    python benchmarks/hf_weights.py --values bf16
    python benchmarks/hf_weights.py --values f32
"""

from __future__ import annotations

import argparse
import json

import torch

from invariant_ops import measure, shapes
from specray.kernels.loader import load_model, resolve


def as_checkpoint(model, values: str) -> None:
    """The model's projections rewritten to what a bf16 or fp32 checkpoint holds, then packed."""
    torch.manual_seed(0)
    with torch.no_grad():
        for w in model.projections():
            w.copy_(w.bfloat16().float() if values == "bf16" else w * (1 + 1e-6 * torch.randn_like(w)))
    model.add_packed_weights()
    assert {p.kind for p in model.packed_weights.values()} == {values}


def set_path(model, path: str, packed: dict) -> None:
    model.gemv_weights, model.packed_weights = {}, packed if path == "packed" else {}
    model.row_invariant = path != "library"
    if path == "library":
        model.add_gemv_weights()


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF alias or path whose values stand in")
    ap.add_argument("--values", choices=["bf16", "f32"], default="bf16", help="what the checkpoint holds")
    ap.add_argument("--repeats", type=int, default=8, help="timed steps per shape and path, per pass")
    ap.add_argument("--passes", type=int, default=2, help="the paths alternate this many times")
    args = ap.parse_args()
    model = load_model(resolve(args.model))
    as_checkpoint(model, args.values)
    packed = dict(model.packed_weights)
    out = {"values": args.values, "weight_mb": round(model.weight_bytes() / 1e6, 1)}
    for name, chunks in shapes().items():
        row = {}
        for _ in range(args.passes):
            for path in ("library", "fixed_chunks", "packed"):
                set_path(model, path, packed)
                row.setdefault(path, []).append(measure(model, chunks, "cpu", args.repeats)["ms"])
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


if __name__ == "__main__":
    main()
