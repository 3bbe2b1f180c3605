"""The load generator's own CPU a streamed token (`specray bench serve`'s `run_level`, 32 Spec-Bench
chat requests x 64 tokens at concurrency C) against a running `specray serve` on this machine
(docs/performance.md, 2026-11-27 afternoon).

    python client_cpu.py 16
"""
import asyncio
import pathlib
import sys
import time

from specray.cluster.bench.load import run_level
from specray.cluster.bench.prompts import load_prompts

prompts = [p["prompt"] for p in load_prompts(pathlib.Path("../shared/data/spec_bench/question.jsonl"), 32)]
bodies = [{"model": "smollm2-135m", "messages": [{"role": "user", "content": p}], "max_tokens": 64, "temperature": 0.0,
           "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}} for p in prompts]
c = int(sys.argv[1])
t0 = time.process_time()
samples, secs = asyncio.run(run_level("http://127.0.0.1:8000", {}, bodies, True, c, None, 0))
cpu = time.process_time() - t0
tokens = sum(s.tokens for s in samples)
print(f"c={c}: {tokens} tokens in {secs:.1f} s, client CPU {cpu:.2f} s = {1000*cpu/tokens:.3f} ms a token")
