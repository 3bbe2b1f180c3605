"""One LLM.generate of N tokens, greedy, plain or n-gram: tokens/s (docs/performance.md, 2026-11-29 night): python gen.py plain 800."""
import sys, time
from specray import LLM, SamplingParams
spec = None if sys.argv[1] == "plain" else {"method": "ngram"}
llm = LLM("smollm2-135m", speculative_config=spec)
p = SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True)
llm.generate(["Write a long story about a dragon."], p)
t = time.perf_counter()
out = llm.generate(["Explain in detail how the water cycle works, step by step."], p)
dt = time.perf_counter() - t
n = len(out[0].outputs[0].token_ids)
print(f"{sys.argv[1]}: {n} tokens in {dt:.2f} s: {n/dt:.1f} tok/s, {dt/n*1e3:.3f} ms/token")
