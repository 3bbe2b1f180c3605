"""Whole SmolLM2-135M forward steps with the C kernels' loops on their own threads or on torch's
OpenMP team (csrc/pool.h), on an idle node and beside a process that wakes up now and then (as a
server's threads do), each case in a fresh process, cases interleaved repeat after repeat.

    python benchmarks/kernel_threads.py --rows 1,3,8 --repeats 3 --noise 0.2 --burst-ms 0.3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEP = """
import {first}, {second}, sys, time
sys.path.insert(0, {bench!r})
from cpu_kernels import forward_steps
from specray.kernels.loader import load_model, resolve
model = load_model(resolve("smollm2-135m"), kernels={kernels!r})
step = forward_steps({{"m": (model, True)}}, {rows})["m"]
for _ in range(5):
    step()
start = time.perf_counter()
for _ in range({steps}):
    step()
print((time.perf_counter() - start) / {steps} * 1e3)
"""

NOISE = """
import time
duty, burst, end = {duty}, {burst}, time.time() + {seconds}
while time.time() < end:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < burst:
        pass
    time.sleep(burst * (1 - duty) / duty)
"""

# The product's two cases: `import specray` first (torch's threads spin briefly, the kernels
# run their own), or torch first with its default wait policy (the kernels run on torch's team).
RUNNERS = {"own threads": ("specray", "torch"), "OpenMP team": ("torch", "specray")}


def one(runner: str, rows: int, args, noise: float) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SPECRAY_CPU_POOL")}
    first, second = RUNNERS[runner]
    code = STEP.format(first=first, second=second, bench=str(Path(__file__).parent), kernels=args.kernels, rows=rows, steps=args.steps)
    busy = None
    if noise:
        busy = subprocess.Popen([sys.executable, "-c", NOISE.format(duty=noise, burst=args.burst_ms / 1e3,
                                                                    seconds=600)])
        time.sleep(0.2)
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    finally:
        if busy is not None:
            busy.kill()
    return float(done.stdout.split()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,3,8", help="rows a step brings (1: decode, k + 1: verification)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes over every case")
    p.add_argument("--steps", type=int, default=200, help="timed steps a case")
    p.add_argument("--kernels", default="fast", choices=["exact", "fast"], help="the model's numeric mode")
    p.add_argument("--noise", type=float, default=0.2, help="share of one core the busy process takes (0: none)")
    p.add_argument("--burst-ms", type=float, default=0.3, help="how long each of its wake-ups computes")
    args = p.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    noises = [0.0] + ([args.noise] if args.noise else [])
    times: dict[tuple, list[float]] = {}
    for _ in range(args.repeats):
        for noise in noises:
            for rows in rows_list:
                for runner in RUNNERS:
                    times.setdefault((noise, rows, runner), []).append(one(runner, rows, args, noise))
    print(f"| busy process | rows | {' | '.join(RUNNERS)} (ms a step, median) | OpenMP / own |")
    print("|---|---|---|---|---|")
    for noise in noises:
        for rows in rows_list:
            med = [statistics.median(times[(noise, rows, r)]) for r in RUNNERS]
            print(f"| {noise:.0%} of a core | {rows} | {' | '.join(f'{m:.2f}' for m in med)} | {med[1] / med[0]:.2f}x |")


if __name__ == "__main__":
    main()
