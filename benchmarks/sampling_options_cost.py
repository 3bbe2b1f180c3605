"""What the target-side sampling options cost at batch 1: greedy decode tokens/s of plain decoding,
n-gram speculation, and plain decoding with a repetition penalty, on the first Spec-Bench questions
(chat template, exactly N new tokens, best of R passes).

    python benchmarks/sampling_options_cost.py --dataset ../shared/data/spec_bench/question.jsonl
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="Spec-Bench question.jsonl")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    from specray import LLM, SamplingParams

    questions = [json.loads(line)["turns"][0] for line in open(args.dataset)][:args.num_prompts]
    configs = [("plain", None, {}), ("ngram k=3", {"method": "ngram", "num_speculative_tokens": 3}, {}),
               ("plain, repetition_penalty 1.1", None, {"repetition_penalty": 1.1})]
    for name, spec, extra in configs:
        llm = LLM(args.model, speculative_config=spec, enable_prefix_caching=False)  # passes repeat the prompts
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, **extra)
        llm.chat([{"role": "user", "content": questions[0]}], params)  # warm-up
        rates = []
        for _ in range(args.repeats):
            start, tokens = time.perf_counter(), 0
            for q in questions:
                tokens += len(llm.chat([{"role": "user", "content": q}], params)[0].outputs[0].token_ids)
            rates.append(tokens / (time.perf_counter() - start))
        print(f"{name}: {max(rates):.1f} tokens/s (best of {args.repeats})", flush=True)
        del llm


if __name__ == "__main__":
    main()
