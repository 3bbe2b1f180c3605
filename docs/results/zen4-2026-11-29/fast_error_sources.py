"""Where the fast kernel mode's error against the exact mode comes from: teacher-forced top-1 agreement
and KL(exact || variant) on the exact mode's greedy continuations of 16 Spec-Bench chats and one
question, for the fast mode, the fast mode with the exact mode's head, and with an fp32 KV cache.

    python docs/results/zen4-2026-11-29/fast_error_sources.py   # from the repository root
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, "benchmarks")
from kernel_modes_quality import teacher_forced  # noqa: E402

from specray import LLM, SamplingParams  # noqa: E402
from specray.cluster.bench.prompts import load_prompts  # noqa: E402
from specray.kernels.loader import load_model, resolve  # noqa: E402

QUESTION = "What is the capital of France?"


def variants(checkpoint) -> dict:
    """The exact model and the fast one three ways: as it is, with the exact head, with an fp32 KV."""
    exact, fast = load_model(checkpoint, kernels="exact"), load_model(checkpoint, kernels="fast")
    exact_head = load_model(checkpoint, kernels="fast")
    exact_head.packed_weights[id(exact_head.lm_head)] = exact.packed_weights[id(exact.lm_head)]
    fp32_kv = load_model(checkpoint, kernels="fast")
    fp32_kv.__class__ = type("Fp32Kv", (type(fast),), {"kv_dtype": property(lambda self: torch.float32)})
    return {"exact": exact, "fast": fast, "fast_exact_head": exact_head, "fast_fp32_kv": fp32_kv}


def main() -> None:
    llm = LLM("smollm2-135m", kernels="exact")
    chats = [p["prompt"] for p in load_prompts(Path("../shared/data/spec_bench/question.jsonl"), 16)] + [QUESTION]
    prompts = [llm.apply_chat_template([{"role": "user", "content": c}]) for c in chats]
    sp = SamplingParams(max_tokens=128, temperature=0.0)
    continuations = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sp)]
    models = variants(resolve("smollm2-135m"))
    agree, kl, positions = dict.fromkeys(models, 0.0), dict.fromkeys(models, 0.0), 0
    for prompt, continuation in zip(prompts, continuations):
        lp = teacher_forced(models, prompt, continuation)  # mode -> [len(continuation), vocab]
        positions += len(continuation)
        for m in models:
            agree[m] += int((lp["exact"].argmax(-1) == lp[m].argmax(-1)).sum())
            kl[m] += float((lp["exact"].exp() * (lp["exact"] - lp[m])).sum())
    decode = llm.get_tokenizer().decode
    for m in models:  # the question's first token, the last prompt's
        top = lp[m][0].topk(3)
        print("France first token", m, [(decode([int(i)]), round(float(v), 3)) for v, i in zip(top.values, top.indices)])
    for m in list(models)[1:]:
        print(m, "top1", round(agree[m] / positions, 4), "kl", round(kl[m] / positions, 5))


if __name__ == "__main__":
    main()
