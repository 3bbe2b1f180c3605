"""Greedy outputs of the exact and fast16 kernel modes against transformers' generate (docs/performance.md, 2026-11-29 evening)."""
import sys
from pathlib import Path
from specray import LLM, SamplingParams
from specray.cluster.bench.prompts import load_prompts
from specray.cluster.bench.hf_baselines import hf_greedy, load_hf
from specray.kernels.loader import resolve
n = int(sys.argv[1])
llms = {m: LLM("smollm2-135m", kernels=m) for m in ("exact", "fast16")}
prompts = [llms["exact"].apply_chat_template([{"role": "user", "content": p["prompt"]}])
           for p in load_prompts(Path("/work/shared/data/spec_bench/question.jsonl"), n)]
sp = SamplingParams(max_tokens=128, temperature=0.0)
outs = {m: [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sp)] for m, llm in llms.items()}
hf = load_hf(resolve("smollm2-135m").path)
eos = llms["exact"].get_tokenizer().eos_token_id
ref = []
for p in prompts:
    g = hf_greedy(hf, p, 128)
    if eos in g: g = g[:g.index(eos) + 1]
    ref.append(g)
def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
for m in outs:
    eq = sum(o == r for o, r in zip(outs[m], ref))
    print(m, "vs transformers: greedy equal", eq, "of", n, "first differences", [first_diff(o, r) for o, r in zip(outs[m], ref) if o != r])
print("fast16 vs exact equal", sum(a == b for a, b in zip(outs["fast16"], outs["exact"])), [first_diff(a, b) for a, b in zip(outs["fast16"], outs["exact"]) if a != b])
