"""Per-call timers around the engine's pieces during one LLM.generate (docs/performance.md, 2026-11-29 night): python engine_prof.py plain 600."""
import sys, time, collections
from specray import LLM, SamplingParams
from specray.kernels import cpu_ops, model as kmodel, batch as kbatch
from specray.actors import target_worker
from specray.cluster.router import router as rmod, sequence as smod
acc = collections.Counter(); cnt = collections.Counter()
def wrap(obj, name, key=None):
    f = getattr(obj, name); key = key or f"{getattr(obj,'__name__',obj)}.{name}"
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; cnt[key] += 1; return r
    setattr(obj, name, g)
spec = None if sys.argv[1] == "plain" else {"method": "ngram"}
llm = LLM("smollm2-135m", speculative_config=spec)
p = SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True)
llm.generate(["Write a long story about a dragon."], p)
for obj, name in [(cpu_ops, "decoder_layers"), (cpu_ops, "decoder_logits"), (cpu_ops.AttentionRows, "build"),
                  (kbatch.RaggedBatch, "build"), (kmodel.LlamaModel, "forward"), (target_worker.TargetWorker, "step"),
                  (target_worker.TargetWorker, "_verify"), (target_worker.TargetWorker, "_results"), (target_worker.TargetWorker, "_step"),
                  (rmod.Router, "step"), (rmod.Router, "_commit_all"), (rmod.Router, "news"), (rmod.Router, "submit_verify"),
                  (rmod.Router, "collect_proposals"), (rmod.Router, "submit_propose"), (rmod.Router, "admit"), (rmod.Router, "_observe"),
                  (smod.Sequence, "detokenize"), (cpu_ops, "argmax_rows")]:
    wrap(obj, name)
t = time.perf_counter()
out = llm.generate(["Explain in detail how the water cycle works, step by step."], p)
dt = time.perf_counter() - t
n = len(out[0].outputs[0].token_ids)
print(f"{sys.argv[1]}: {n} tokens, {dt/n*1e3:.3f} ms/token")
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"  {k:40s} {v/n*1e3:7.3f} ms/token  {cnt[k]/n:5.2f} calls/token  {v/cnt[k]*1e6:8.1f} us/call")
