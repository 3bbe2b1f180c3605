"""Where a target worker's step goes, part by part (throwaway probe, 2026-11-27 night): timers around
the worker's and the model's calls over 8 Spec-Bench prompts x 128 tokens, fast kernels.

    python plain_step_parts.py none        # or a speculative_config as JSON
"""
import sys, time, json, collections
from pathlib import Path
from specray import LLM, SamplingParams
from specray.cluster.bench.prompts import load_prompts
from specray.kernels.chat import prompt_token_ids
from specray.kernels.loader import resolve
from specray.actors import target_worker as tw
from specray.kernels import model as mm, batch as bt, cpu_ops
acc = collections.defaultdict(float); cnt = collections.Counter()
inside = [False]
def wrap(obj, name, label):
    orig = getattr(obj, name)
    def f(*a, **k):
        if not inside[0]: return orig(*a, **k)
        t = time.perf_counter(); r = orig(*a, **k); acc[label] += time.perf_counter() - t; cnt[label] += 1; return r
    setattr(obj, name, f)
o = tw.TargetWorker.step
def step(self, items):
    inside[0] = True; t = time.perf_counter()
    try: return o(self, items)
    finally: acc["step"] += time.perf_counter() - t; cnt["step"] += 1; inside[0] = False
tw.TargetWorker.step = step
for n in ("_rule", "_chunk", "_verify", "_commit", "_attach_logprobs"): wrap(tw.TargetWorker, n, n)
wrap(bt.RaggedBatch, "build", "RaggedBatch.build")
wrap(mm.LlamaModel, "forward", "forward")
wrap(cpu_ops.AttentionRows, "build", "AttentionRows.build")
wrap(cpu_ops, "decoder_layers", "decoder_layers")
wrap(cpu_ops, "decoder_logits", "decoder_logits")
cfg = json.loads(sys.argv[1]) if sys.argv[1] != "none" else None
tok = resolve("smollm2-135m").tokenizer()
prompts = load_prompts(Path("/work/shared/data/spec_bench/question.jsonl"), 8)
ids = [prompt_token_ids(tok, p["prompt"]) for p in prompts]
llm = LLM("smollm2-135m", kernels="fast", speculative_config=cfg)
sp = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
llm.generate({"prompt_token_ids": ids[0]}, sp); acc.clear(); cnt.clear()
t0 = time.perf_counter()
for i in ids: llm.generate({"prompt_token_ids": i}, sp)
wall = time.perf_counter() - t0
n = cnt["step"]
print(f"wall per step {wall/n*1e6:.0f} us")
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"{k:22s} {v/n*1e6:8.1f} us a step ({cnt[k]/n:.2f} calls)")
