"""Where the fast kernel mode's error against the exact mode comes from: teacher-forced top-1 agreement
and KL(exact || variant) on the exact mode's greedy continuations of 16 Spec-Bench chats and one
question, for the fast mode, the fast mode with the exact mode's head, and with an fp32 KV cache.

    python docs/results/zen4-2026-11-29/fast_error_sources.py   # from the repository root
"""
import sys

import torch
sys.path.insert(0, "benchmarks")  # kernel_modes_quality.teacher_forced
from pathlib import Path
from kernel_modes_quality import teacher_forced
from specray import LLM, SamplingParams
from specray.cluster.bench.prompts import load_prompts
from specray.kernels.loader import load_model, resolve
exact_llm = LLM("smollm2-135m", kernels="exact")
prompts = [exact_llm.apply_chat_template([{"role": "user", "content": p["prompt"]}])
           for p in load_prompts(Path("../shared/data/spec_bench/question.jsonl"), 16)]
prompts.append(exact_llm.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
sp = SamplingParams(max_tokens=128, temperature=0.0)
exact_out = [o.outputs[0].token_ids for o in exact_llm.generate([{"prompt_token_ids": p} for p in prompts], sp)]
ck = resolve("smollm2-135m")
ex = load_model(ck, kernels="exact")
fast = load_model(ck, kernels="fast")
hybrid = load_model(ck, kernels="fast")
hybrid.packed_weights[id(hybrid.lm_head)] = ex.packed_weights[id(ex.lm_head)]
print(type(fast.packed_head()).__name__, type(hybrid.packed_head()).__name__)
models = {"exact": ex, "fast": fast, "fast_exact_head": hybrid}
stats = {m: [0, 0.0] for m in ("fast", "fast_exact_head")}; positions = 0
for prompt, cont in zip(prompts, exact_out):
    lp = teacher_forced(models, prompt, cont)
    positions += len(cont)
    for m in stats:
        stats[m][0] += int((lp["exact"].argmax(-1) == lp[m].argmax(-1)).sum())
        stats[m][1] += float((lp["exact"].exp() * (lp["exact"] - lp[m])).sum())
    if prompt is prompts[-1]:
        for m in models:
            top = lp[m][0].topk(3)
            print("France first token", m, [(exact_llm.get_tokenizer().decode([int(i)]), round(float(v), 3)) for v, i in zip(top.values, top.indices)])
for m, (a, k) in stats.items():
    print(m, "top1", round(a / positions, 4), "kl", round(k / positions, 5))
# the fast mode with an fp32 KV cache (the exact mode's)
class Fp32Kv(type(fast)):
    @property
    def kv_dtype(self):
        return torch.float32
f32 = load_model(ck, kernels="fast"); f32.__class__ = Fp32Kv
models = {"exact": ex, "fast_fp32_kv": f32}
a = k = 0.0; positions = 0
for prompt, cont in zip(prompts, exact_out):
    lp = teacher_forced(models, prompt, cont)
    positions += len(cont)
    a += int((lp["exact"].argmax(-1) == lp["fast_fp32_kv"].argmax(-1)).sum())
    k += float((lp["exact"].exp() * (lp["exact"] - lp["fast_fp32_kv"])).sum())
print("fast_fp32_kv top1", round(a / positions, 4), "kl", round(k / positions, 5), f32.make_cache(4).kv.dtype)
