"""n choices of one prompt, with prefix caching: the later choices charged what the cache leaves them
(admission.prefill_cost, the product) against charged their whole prompt (the rule before), the two
alternating request by request in one process; time to the last choice's first token (max_tokens 1).

    python docs/results/zen5-2026-11-28-eagle-prefix/n_choices.py --dataset ../shared/data/spec_bench/question.jsonl
"""
import argparse
import json
import statistics
import time

from specray import LLM, SamplingParams
from specray.cluster.router import admission

p = argparse.ArgumentParser()
p.add_argument("--dataset", required=True)
p.add_argument("--n", type=int, default=8)
p.add_argument("--num-prompts", type=int, default=8)
args = p.parse_args()
rows = [json.loads(line)["turns"][0] for line in open(args.dataset)]
prompts = [q for q in rows if 600 < len(q) < 1000][:args.num_prompts]
llm = LLM("smollm2-135m", kernels="fast")
charged = admission.prefill_cost
rules = {"cache-aware": charged, "whole prompt": lambda router, seq: len(seq.prompt_token_ids)}
times = {name: [] for name in rules}
params = SamplingParams(n=args.n, max_tokens=1, temperature=1.0, seed=1)
llm.generate("warm-up", params)
for r in range(2):
    for i, q in enumerate(prompts):
        for name, rule in rules.items():
            admission.prefill_cost = rule
            start = time.perf_counter()
            out = llm.generate(f"{name} {r} {i}. {q}", params)[0]  # a prompt of its own: no cross-run hits
            times[name].append(time.perf_counter() - start)
admission.prefill_cost = charged
for name, t in times.items():
    print(f"{name}: n = {args.n}, {statistics.median(t) * 1e3:.0f} ms to every choice's first token (median of {len(t)})")
print(f"ratio {statistics.median(times['whole prompt']) / statistics.median(times['cache-aware']):.2f}x")
