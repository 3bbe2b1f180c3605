"""Paired speed-up of speculative configs over plain decoding, robust to a noisy shared machine.

Every prompt group runs under every config back to back (the order rotating per group and repeat),
so slow spells of the machine hit all configs alike; the figure of merit is the median over groups
of the per-group time ratio (plain / config), next to the pooled tokens/s. Greedy, exactly N new
tokens, outputs checked equal to plain decoding's.

    python benchmarks/paired_speedup.py --configs '[{"method": "eagle", "model": "smollm2-135m-eagle",
        "num_speculative_tokens": 1}]' --num-prompts 13 --repeats 3 --batch-size 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from spec_args import add_common_args, engine_args, configs_of, prompts_with_categories, write_result  # noqa: E402


def run_group(llm, group: list[list[int]], max_tokens: int):
    """One prompt group as one batch -> (outputs, seconds, decode seconds, emitted tokens, rounds);
    decode seconds leave out the target steps that held a prompt's prefill (the same work with or
    without speculation)."""
    from specray import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prefill = llm.router.stats.prefill_seconds
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in group], sp)
    seconds = time.perf_counter() - start
    decode = seconds - (llm.router.stats.prefill_seconds - prefill)
    rounds = sum(o.metrics.num_rounds for o in outs)
    emitted = sum(o.metrics.num_emitted_tokens for o in outs)
    return [o.outputs[0].token_ids for o in outs], seconds, decode, emitted, rounds


def main(argv: list[str] | None = None) -> dict:
    from specray import LLM, SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, num_prompts=13, repeats=3, kernels="exact")
    ap.add_argument("--batch-size", type=int, default=1, help="prompts per group (one batch)")
    ap.add_argument("--raw-prompts", action="store_true",
                    help="prompts as plain text, no chat template (the model continues them, quoting itself)")
    ap.add_argument("--out", default="bench_out/paired_speedup.json")
    args = ap.parse_args(argv)
    configs = configs_of(args.configs)
    if args.batch_size < 1 or args.repeats < 1 or args.num_prompts < args.batch_size:
        raise SystemExit("need --batch-size >= 1, --repeats >= 1 and --num-prompts >= --batch-size")

    ids, categories = prompts_with_categories(args, raw=args.raw_prompts)
    starts = range(0, len(ids) - args.batch_size + 1, args.batch_size)
    groups = [ids[i:i + args.batch_size] for i in starts]
    group_categories = [category_of(categories[i:i + args.batch_size]) for i in starts]
    names = ["plain"] + [json.dumps(c, sort_keys=True) for c in configs]
    llms = [LLM(args.model, max_num_seqs=args.batch_size, **engine_args(args))] + [
        LLM(args.model, max_num_seqs=args.batch_size, speculative_config=c, **engine_args(args)) for c in configs]
    for llm in llms:  # warm-up
        llm.generate({"prompt_token_ids": ids[0][:16]}, SamplingParams(temperature=0.0, max_tokens=4))
    want = [run_group(llms[0], g, args.max_tokens)[0] for g in groups]
    seconds = {n: [] for n in names}  # per (repeat, group)
    decode = {n: [] for n in names}  # the same without the prefill steps
    emitted = {n: [] for n in names}  # per (repeat, group): (emitted tokens, rounds)
    lossless = {n: True for n in names}
    for r in range(args.repeats):
        for gi, group in enumerate(groups):
            shift = (r + gi) % len(names)
            for j in list(range(len(names)))[shift:] + list(range(len(names)))[:shift]:
                outs, s, d, e, rounds = run_group(llms[j], group, args.max_tokens)
                seconds[names[j]].append(s)
                decode[names[j]].append(d)
                emitted[names[j]].append((e, rounds))
                lossless[names[j]] &= outs == want[gi]
    tokens = args.repeats * sum(len(o) for w in want for o in w)
    rows = []
    for n in names:
        ratios = [p / s for p, s in zip(seconds["plain"], seconds[n], strict=True)]
        rows.append({"config": n, "tokens_per_s": round(tokens / sum(seconds[n]), 2),
                     "median_group_speedup": round(statistics.median(ratios), 3),
                     "pooled_speedup": round(sum(seconds["plain"]) / sum(seconds[n]), 3),
                     "decode_speedup": round(sum(decode["plain"]) / sum(decode[n]), 3),
                     "acceptance_length": acceptance_length(emitted[n]),
                     "lossless": lossless[n]})
        print(json.dumps(rows[-1]), flush=True)
    by_category = per_category(names, group_categories * args.repeats, decode, emitted)
    print(json.dumps({"decode_speedup_by_category": by_category}), flush=True)
    result = {"config": vars(args), "groups": len(groups), "tokens_per_config": tokens, "rows": rows,
              "by_category": by_category}
    return write_result(result, args.out)


def category_of(categories: list[str]) -> str:
    """A group's Spec-Bench category: its prompts', or "mixed"."""
    return categories[0] if len(set(categories)) == 1 else "mixed"


def acceptance_length(emitted: list[tuple[int, int]]) -> float:
    return round(sum(e for e, _ in emitted) / max(sum(r for _, r in emitted), 1), 3)


def per_category(names: list[str], categories: list[str], decode: dict, emitted: dict) -> dict:
    """category -> config -> {decode speed-up over plain, acceptance length} over that category's
    (repeat, group) runs; `categories` has one entry per run, in the runs' order."""
    out = {}
    for category in sorted(set(categories)):
        runs = [i for i, c in enumerate(categories) if c == category]
        plain = sum(decode["plain"][i] for i in runs)
        out[category] = {n: {"decode_speedup": round(plain / sum(decode[n][i] for i in runs), 3),
                             "acceptance_length": acceptance_length([emitted[n][i] for i in runs])}
                         for n in names[1:]}
    return out


if __name__ == "__main__":
    main()
