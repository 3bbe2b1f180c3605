"""The in-process engine at c = 1 (defaults, 12 Spec-Bench prompts x 64 tokens, three timed passes),
run with and without an idle `specray serve` beside it: what the idle serving stack costs a
computing process on a 2-core box (docs/performance.md, 2026-11-27 afternoon).

    python inproc_idle.py 3    # then start `specray serve`, wait until it answers, run it again
"""
import sys
import time
from pathlib import Path

from specray import LLM
from specray.cluster.bench.cluster import closed_loop
from specray.cluster.bench.prompts import load_prompts
from specray.cluster.params import SamplingParams
from specray.kernels.chat import prompt_token_ids

r = LLM("smollm2-135m", max_num_seqs=1).router
params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
reqs = [prompt_token_ids(r.tokenizer, p["prompt"]) for p in load_prompts(Path("../shared/data/spec_bench/question.jsonl"), 12)]
closed_loop(r, reqs[:1], params, 1)
for i in range(int(sys.argv[1])):
    print(time.strftime("%H:%M:%S"), round(closed_loop(r, reqs, params, 1)["throughput_tokens_per_s"], 1), flush=True)
