"""What automatic prefix caching buys and costs, in-process at batch 1, with it on and off side by side.

Follow-up turns: Spec-Bench's two-turn questions; the first turn is answered, then the second turn
(the first, its answer and the new question, through the chat template) is timed to its first token
(`max_tokens` 1: the prompt's prefill). Shared context: one long RAG passage as the system message
before different questions, each timed to its first token after the first. Decode: greedy tokens/s
of the first turns, exactly `--max-tokens` each (what registering blocks costs a step). The two
engines alternate request by request; the figures are medians.

    python benchmarks/prefix_caching.py --dataset ../shared/data/spec_bench/question.jsonl --kernels fast
    python benchmarks/prefix_caching.py --dataset ../shared/data/spec_bench/question.jsonl --speculative-method eagle

Both engines' answers are compared token for token (prefix caching must change none).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from specray.kernels.kernel_modes import KERNEL_MODES


def timed(llm, messages, params):
    start = time.perf_counter()
    out = llm.chat(messages, params)[0]
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="Spec-Bench question.jsonl")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--kernels", choices=list(KERNEL_MODES), default="exact")
    p.add_argument("--num-prompts", type=int, default=12, help="two-turn questions and shared-context questions")
    p.add_argument("--max-tokens", type=int, default=64, help="the first turns' answers (decode timed on them)")
    p.add_argument("--speculative-method", default=None,
                   help="speculative_config's method for both engines (eagle, longspec: drafts that read the "
                        "target's features); default: the engine's default speculation")
    p.add_argument("--out", help="also write the figures as JSON here")
    args = p.parse_args(argv)
    from specray import LLM, SamplingParams

    rows = [json.loads(line) for line in open(args.dataset)]
    two_turn = [r["turns"] for r in rows if len(r["turns"]) == 2][:args.num_prompts]
    passage = next(r["turns"][0] for r in rows if r["category"] == "rag")
    singles = [r["turns"][0] for r in rows if len(r["turns"]) == 1 and r["category"] == "qa"][:args.num_prompts]
    spec = None
    if args.speculative_method is not None:
        from specray.cluster.config.defaults import method_recipe

        spec = method_recipe(args.model, args.speculative_method, {}) or {"method": args.speculative_method}
    engines = {on: LLM(args.model, speculative_config=spec, kernels=args.kernels, enable_prefix_caching=on)
               for on in (True, False)}
    answer = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    first = SamplingParams(temperature=0, max_tokens=1)
    for llm in engines.values():  # warm-up
        llm.chat([{"role": "user", "content": singles[0]}], answer)
    res = {on: {"decode_tokens_per_s": [], "turn2_ttft_s": [], "turn2_hit": [], "shared_ttft_s": [],
                "shared_hit": []} for on in engines}
    for t1, t2 in two_turn:
        answers = {}
        for on, llm in engines.items():
            seconds, out = timed(llm, [{"role": "user", "content": t1}], answer)
            answers[on] = out.outputs[0].token_ids
            res[on]["decode_tokens_per_s"].append(len(out.outputs[0].token_ids) / seconds)
            follow = [{"role": "user", "content": t1}, {"role": "assistant", "content": out.outputs[0].text},
                      {"role": "user", "content": t2}]
            seconds, out2 = timed(llm, follow, first)
            res[on]["turn2_ttft_s"].append(seconds)
            res[on]["turn2_hit"].append(out2.num_cached_tokens / len(out2.prompt_token_ids))
        assert answers[True] == answers[False], "prefix caching changed an answer"
    for q in singles:
        for on, llm in engines.items():
            seconds, out = timed(llm, [{"role": "system", "content": passage}, {"role": "user", "content": q}], first)
            res[on]["shared_ttft_s"].append(seconds)
            res[on]["shared_hit"].append(out.num_cached_tokens / len(out.prompt_token_ids))
    summary = {("on" if on else "off"): {k: statistics.median(v[1:] if k.startswith("shared") else v)
                                        for k, v in r.items()} for on, r in res.items()}
    for name, s in summary.items():
        print(f"prefix caching {name}: decode {s['decode_tokens_per_s']:.1f} tokens/s; follow-up turn TTFT "
              f"{1e3 * s['turn2_ttft_s']:.1f} ms ({100 * s['turn2_hit']:.0f} % cached); shared-context TTFT "
              f"{1e3 * s['shared_ttft_s']:.1f} ms ({100 * s['shared_hit']:.0f} % cached)")
    on, off = summary["on"], summary["off"]
    print(f"on / off: decode {on['decode_tokens_per_s'] / off['decode_tokens_per_s']:.3f}x, follow-up TTFT "
          f"{off['turn2_ttft_s'] / on['turn2_ttft_s']:.2f}x faster, shared-context TTFT "
          f"{off['shared_ttft_s'] / on['shared_ttft_s']:.2f}x faster")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "runs": {str(k): v for k, v in res.items()}}, f,
                      indent=1)
    return summary


if __name__ == "__main__":
    main()
