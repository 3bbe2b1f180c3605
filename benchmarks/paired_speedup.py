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
from spec_args import add_common_args, configs_of, prompt_ids, write_result  # noqa: E402


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

    ids = prompt_ids(args, raw=args.raw_prompts)
    groups = [ids[i:i + args.batch_size] for i in range(0, len(ids) - args.batch_size + 1, args.batch_size)]
    names = ["plain"] + [json.dumps(c, sort_keys=True) for c in configs]
    llms = [LLM(args.model, max_num_seqs=args.batch_size, kernels=args.kernels)] + [
        LLM(args.model, max_num_seqs=args.batch_size, speculative_config=c, kernels=args.kernels) for c in configs]
    for llm in llms:  # warm-up
        llm.generate({"prompt_token_ids": ids[0][:16]}, SamplingParams(temperature=0.0, max_tokens=4))
    want = [run_group(llms[0], g, args.max_tokens)[0] for g in groups]
    seconds = {n: [] for n in names}  # per (repeat, group)
    decode = {n: [] for n in names}  # the same without the prefill steps
    emitted = {n: [0, 0] for n in names}  # emitted tokens, rounds
    lossless = {n: True for n in names}
    for r in range(args.repeats):
        for gi, group in enumerate(groups):
            shift = (r + gi) % len(names)
            for j in list(range(len(names)))[shift:] + list(range(len(names)))[:shift]:
                outs, s, d, e, rounds = run_group(llms[j], group, args.max_tokens)
                seconds[names[j]].append(s)
                decode[names[j]].append(d)
                emitted[names[j]][0] += e
                emitted[names[j]][1] += rounds
                lossless[names[j]] &= outs == want[gi]
    tokens = args.repeats * sum(len(o) for w in want for o in w)
    rows = []
    for n in names:
        ratios = [p / s for p, s in zip(seconds["plain"], seconds[n], strict=True)]
        rows.append({"config": n, "tokens_per_s": round(tokens / sum(seconds[n]), 2),
                     "median_group_speedup": round(statistics.median(ratios), 3),
                     "pooled_speedup": round(sum(seconds["plain"]) / sum(seconds[n]), 3),
                     "decode_speedup": round(sum(decode["plain"]) / sum(decode[n]), 3),
                     "acceptance_length": round(emitted[n][0] / max(emitted[n][1], 1), 3),
                     "lossless": lossless[n]})
        print(json.dumps(rows[-1]), flush=True)
    result = {"config": vars(args), "groups": len(groups), "tokens_per_config": tokens, "rows": rows}
    return write_result(result, args.out)


if __name__ == "__main__":
    main()
