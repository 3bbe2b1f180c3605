"""Greedy speculation equals plain decoding in fast16 (the default on the GGUF), SmolLM2, in process (docs/performance.md, 2026-11-29 evening)."""

from specray import LLM, SamplingParams
qs = ["What is the capital of France?", "Explain photosynthesis in two sentences.", "Write a haiku about the sea.",
      "List three uses of Python.", "Summarize: The quick brown fox jumps over the lazy dog. The dog sleeps.", "What is 12 times 12?"]
msgs = [[{"role": "user", "content": q}] for q in qs]
sp = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
plain = LLM("smollm2-135m", max_num_seqs=8)
assert plain.target.model.kernel_mode == "fast16"
want = [o.outputs[0].token_ids for o in plain.chat(msgs, sp)]
E = "smollm2-135m-eagle"
configs = {
  "default(auto ngram)": "default",
  "ngram k4": {"method": "ngram", "num_speculative_tokens": 4},
  "draft q4_1": {"method": "draft_model", "model": "smollm2-135m-draft", "num_speculative_tokens": 3, "draft_quantization": "q4_1"},
  "eagle k3": {"method": "eagle", "model": E, "num_speculative_tokens": 3},
  "eagle lookup-first adaptive": {"method": "eagle", "model": E, "num_speculative_tokens": 4, "lookup_first": {"model_tokens": 1}, "adaptive": True},
  "eagle topk tree": {"method": "eagle", "model": E, "num_speculative_tokens": 3, "tree": {"kind": "topk", "k": 2, "width": 2}},
  "draft rsd_c": {"method": "draft_model", "model": "smollm2-135m-draft", "num_speculative_tokens": 3, "tree": {"kind": "rsd_c", "branching": [2, 2, 1]}},
  "draft spectr": {"method": "draft_model", "model": "smollm2-135m-draft", "num_speculative_tokens": 3, "tree": {"kind": "spectr", "k": 2}},
  "aded": {"method": "aded", "num_speculative_tokens": 4},
  "easyspec lp2": {"method": "draft_model", "model": "smollm2-135m-draft", "num_speculative_tokens": 3, "layer_parallel": 2},
}
bad = 0
for name, cfg in configs.items():
    try:
        llm = LLM("smollm2-135m", max_num_seqs=8) if cfg == "default" else LLM("smollm2-135m", speculative_config=cfg, max_num_seqs=8)
        b6 = [o.outputs[0].token_ids for o in llm.chat(msgs, sp)]
        b1 = [llm.chat([m], sp)[0].outputs[0].token_ids for m in msgs[:3]]
        ok = b6 == want and b1 == want[:3]
        acc = None
        print(f"{'OK ' if ok else 'BAD'} {name}", flush=True)
        bad += not ok
    except Exception as e:
        print(f"ERR {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
print("bad", bad)
