"""Where a round of the eagle draft goes, part by part (throwaway probe, 2026-11-27 night): wraps the
drafter's and the model's calls with timers over 8 Spec-Bench prompts x 128 tokens, fast kernels.

    python eagle_draft_parts.py '{"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 1}'
"""
import sys, time, json, collections
from pathlib import Path
from specray import LLM, SamplingParams
from specray.cluster.bench.prompts import load_prompts
from specray.kernels.chat import prompt_token_ids
from specray.kernels.loader import resolve
from specray.kernels.drafters import eagle as eg
from specray.kernels import cpu_ops, batch as bt, model as mm
acc = collections.defaultdict(float); cnt = collections.Counter()
inside = [False]
def wrap(obj, name, label, only_inside=True):
    orig = getattr(obj, name)
    def f(*a, **k):
        if only_inside and not inside[0]: return orig(*a, **k)
        t = time.perf_counter(); r = orig(*a, **k); acc[label] += time.perf_counter() - t; cnt[label] += 1; return r
    setattr(obj, name, f)
o_prop = eg.EagleDrafter.propose
def prop(self, reqs):
    inside[0] = True
    t = time.perf_counter()
    try: return o_prop(self, reqs)
    finally:
        acc["propose"] += time.perf_counter() - t; cnt["propose"] += 1; inside[0] = False
eg.EagleDrafter.propose = prop
wrap(eg.EagleDrafter, "_calibrate", "_calibrate")
wrap(eg.EagleModel, "inputs", "inputs(fc)")
wrap(bt.RaggedBatch, "build", "RaggedBatch.build")
wrap(cpu_ops.AttentionRows, "build", "AttentionRows.build")
wrap(cpu_ops, "decoder_layers", "decoder_layers")
wrap(mm.LlamaModel, "norm_rows", "norm_rows")
wrap(mm, "fast_linear", "fast_linear")
wrap(mm.LlamaModel, "forward", "model.forward")
wrap(eg.EagleDrafter, "_draw", "_draw")
cfg = json.loads(sys.argv[1])
tok = resolve("smollm2-135m").tokenizer()
prompts = load_prompts(Path("/work/shared/data/spec_bench/question.jsonl"), 8)
ids = [prompt_token_ids(tok, p["prompt"]) for p in prompts]
llm = LLM("smollm2-135m", kernels="fast", speculative_config=cfg)
sp = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
llm.generate({"prompt_token_ids": ids[0]}, sp); acc.clear(); cnt.clear()
for i in ids: llm.generate({"prompt_token_ids": i}, sp)
n = cnt["propose"]
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"{k:22s} {v/n*1e6:7.1f} us a round ({cnt[k]/n:.2f} calls)")
