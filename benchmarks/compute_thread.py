"""Why every worker computes on one thread (cluster/pools/compute_thread.py): an engine built and
stepped on the main thread, built there and stepped from a second thread, and built and stepped on
one executor thread; each case in a fresh process, cases interleaved.

    python benchmarks/compute_thread.py --kernels fast --num-prompts 4 --max-tokens 64
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from specray import LLM
from specray.cluster.bench.cluster import closed_loop
from specray.cluster.bench.prompts import load_prompts
from specray.cluster.params import SamplingParams
from specray.kernels.chat import prompt_token_ids
from specray.kernels.kernel_modes import KERNEL_MODES


def engine(kernels: str):
    return LLM("smollm2-135m", speculative_config=None, max_num_seqs=1, pipelined=False, kernels=kernels).router


def tokens_per_s(router, args) -> float:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    requests = [prompt_token_ids(router.tokenizer, p["prompt"]) for p in load_prompts(None, args.num_prompts)]
    closed_loop(router, requests[:1], params, 1)  # warm-up on this thread
    return closed_loop(router, requests, params, 1)["throughput_tokens_per_s"]


def on_thread(fn, *args):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    thread.join()
    return out[0]


def run_case(case: str, args) -> float:
    """One case in this process: `main` builds and steps on the main thread, `second` builds there
    and steps from a second thread (its thread count set alike), `executor` builds and steps on one
    executor thread (what the compute thread does)."""
    if case == "executor":
        with ThreadPoolExecutor(1) as one:
            return one.submit(lambda: tokens_per_s(engine(args.kernels), args)).result()
    router, threads = engine(args.kernels), torch.get_num_threads()
    if case == "main":
        return tokens_per_s(router, args)

    def second():
        torch.set_num_threads(threads)  # the count is the calling thread's
        return tokens_per_s(router, args)
    tokens_per_s(router, args)  # the main thread's OpenMP team exists, as after a worker's warm-up
    return on_thread(second)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", choices=list(KERNEL_MODES), default="fast", help="the model's numeric mode")
    ap.add_argument("--num-prompts", type=int, default=4, help="batch-1 requests a measurement")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens a request")
    ap.add_argument("--repeats", type=int, default=2, help="each case this many times, interleaved")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in a fresh process
    args = ap.parse_args()
    if args.case:
        print(run_case(args.case, args))
        return
    flags = ["--kernels", args.kernels, "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens)]
    results: dict[str, list[float]] = {c: [] for c in CASES}
    for _ in range(args.repeats):
        for case in CASES:  # a fresh process each: OpenMP teams outlive their measurement
            out = subprocess.run([sys.executable, __file__, "--case", case, *flags], capture_output=True, text=True,
                                 check=True).stdout
            results[case].append(float(out.strip().splitlines()[-1]))
    for case, values in results.items():
        print(f"{case}: {' / '.join(f'{v:.1f}' for v in values)} tokens/s", flush=True)


CASES = ("main", "second", "executor")

if __name__ == "__main__":
    main()
