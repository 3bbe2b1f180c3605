"""A/B the CPU C kernels of another commit against the working tree's, in one process.

Both libraries are built from their `kernels/csrc/` sources and bound alike; whole SmolLM2-135M
forward steps (a decode step at 1 row, verification at k + 1) then alternate between them repeat
after repeat, so a noisy shared box slows both alike. Also reports whether the logits agree.

    python benchmarks/kernel_ab.py --base de7e234 --rows 1,3,8
    SPECRAY_CPU_KERNEL_FLAGS=-mno-avx512f python benchmarks/kernel_ab.py --base HEAD --rows 3,5  # AVX2 paths
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels import forward_steps  # noqa: E402

from specray.kernels import cpu_kernels  # noqa: E402
from specray.kernels.batch import RaggedBatch, SeqChunk  # noqa: E402
from specray.kernels.kernel_modes import KERNEL_MODES  # noqa: E402
from specray.kernels.loader import load_model, resolve  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def build(sources: dict[str, bytes], out: Path) -> ctypes.CDLL:
    """Compile the named C sources (headers beside them) with the product's flags."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        (out / name).write_bytes(text)
    c_files = [str(out / p.name) for p in cpu_kernels.SOURCES if p.name in sources]
    flags = [*cpu_kernels.CFLAGS, *os.environ.get(cpu_kernels.FLAGS_ENV, "").split()]  # as cpu_kernels builds
    subprocess.run([os.environ.get("CC", "cc"), *flags, *c_files, "-o", str(out / "lib.so"), "-lm"],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(out / "lib.so"))
    for name, argtypes in cpu_kernels.SIGNATURES.items():  # an older commit may lack newer functions
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, cpu_kernels.RESTYPES.get(name)
    return lib


def sources_at(rev: str | None) -> dict[str, bytes]:
    names = [p.name for p in cpu_kernels.SOURCES + cpu_kernels.HEADERS]
    if rev is None:
        return {n: (cpu_kernels.CSRC / n).read_bytes() for n in names}
    shown = {n: subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:kernels/csrc/{n}"], capture_output=True)
             for n in names}
    return {n: done.stdout for n, done in shown.items() if done.returncode == 0}  # files it did not have yet


def logits(model, rows: int, context: int) -> torch.Tensor:
    cache = model.make_cache(64, block_size=16)
    model(RaggedBatch.build([SeqChunk("s", list(range(100, 100 + context)), 0)], cache), cache)
    cache.set_cached("s", context)
    return model(RaggedBatch.build([SeqChunk("s", [7] * rows, context, num_logits=rows)], cache), cache)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="commit whose kernels/csrc is the baseline")
    ap.add_argument("--rows", default="1,3,8")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--kernels", choices=list(KERNEL_MODES), default="exact", help="the model's numeric mode")
    ap.add_argument("--context", type=int, default=200, help="cached tokens before the step (at most 1000)")
    args = ap.parse_args()
    if not 1 <= args.context <= 1000:  # the cache holds 1024 tokens
        ap.error("--context must be in [1, 1000]")
    model = load_model(resolve("smollm2-135m"), kernels=args.kernels)
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"base": build(sources_at(args.base), Path(tmp) / "base"),
                "tree": build(sources_at(None), Path(tmp) / "tree")}
        for rows in [int(r) for r in args.rows.split(",")]:
            step = forward_steps({"m": (model, True)}, rows, args.context)["m"]
            outs, times = {}, {name: [] for name in libs}
            for name, lib in libs.items():
                cpu_kernels._LIBRARY = lib
                outs[name] = logits(model, rows, args.context)
            for _ in range(args.repeats):
                for name, lib in libs.items():
                    cpu_kernels._LIBRARY = lib
                    step()
                    start = time.perf_counter()
                    for _ in range(3):
                        step()
                    times[name].append((time.perf_counter() - start) / 3)
            base, tree = (statistics.median(times[n]) * 1e3 for n in ("base", "tree"))
            diff = (outs["base"] - outs["tree"]).abs().max().item()
            print(f"rows {rows:2d}: base {base:6.2f} ms, working tree {tree:6.2f} ms, {base / tree:.2f}x; "
                  f"logits max |diff| {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
