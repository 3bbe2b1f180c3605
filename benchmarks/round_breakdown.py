"""Where a speculative round's time goes at batch 1, against plain decoding, in one process.

Per config: decode tokens/s (prefill steps left out), acceptance length tau, and a round's
milliseconds split into the target's step, the draft's steps and the rest (verification
bookkeeping, the router). Configs alternate prompt by prompt, so a noisy box slows all alike.
`bound` is what the round would give if nothing but its measured target step were paid:
tau x (plain round / this round's target step); speculation pays only where it exceeds 1.

    python benchmarks/round_breakdown.py --kernels fast --num-prompts 8 --max-tokens 128 \\
        --configs '[{"method": "eagle", "model": "smollm2-135m-eagle", "num_speculative_tokens": 1}]'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from spec_args import add_common_args, engine_args, configs_of, prompt_ids, write_result  # noqa: E402


def run(llm, ids: list[int], max_tokens: int) -> tuple[float, float, float, float, int, int]:
    """One prompt -> (seconds, prefill, target, draft seconds, rounds, emitted tokens)."""
    from specray import SamplingParams

    stats = llm.router.stats
    before = (stats.prefill_seconds, stats.target_seconds, stats.draft_seconds)
    start = time.perf_counter()
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                 ignore_eos=True))[0]
    seconds = time.perf_counter() - start
    return (seconds, stats.prefill_seconds - before[0], stats.target_seconds - before[1],
            stats.draft_seconds - before[2], out.metrics.num_rounds, out.metrics.num_emitted_tokens)


def breakdown(totals: list[float], plain_round_ms: float | None) -> dict:
    seconds, prefill, target, draft, rounds, emitted = totals
    decode = seconds - prefill
    row = {"decode_tokens_per_s": round(emitted / decode, 2), "acceptance_length": round(emitted / rounds, 3),
           "round_ms": round(1e3 * decode / rounds, 3), "target_ms": round(1e3 * (target - prefill) / rounds, 3),
           "draft_ms": round(1e3 * draft / rounds, 3)}
    row["other_ms"] = round(row["round_ms"] - row["target_ms"] - row["draft_ms"], 3)
    if plain_round_ms:
        row["bound"] = round(row["acceptance_length"] * plain_round_ms / row["target_ms"], 3)
    return row


def main(argv: list[str] | None = None) -> dict:
    from specray import LLM, SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, num_prompts=8, repeats=2, kernels="fast")
    ap.add_argument("--out", default="bench_out/round_breakdown.json")
    args = ap.parse_args(argv)
    configs = configs_of(args.configs)
    ids = prompt_ids(args)
    names = ["plain"] + [json.dumps(c, sort_keys=True) for c in configs]
    llms = [LLM(args.model, max_num_seqs=1, **engine_args(args))] + [
        LLM(args.model, max_num_seqs=1, **engine_args(args), speculative_config=c) for c in configs]
    for llm in llms:  # warm-up
        llm.generate({"prompt_token_ids": ids[0][:16]}, SamplingParams(temperature=0.0, max_tokens=4))
    totals = {n: [0.0] * 6 for n in names}
    for _ in range(args.repeats):
        for p in ids:
            for name, llm in zip(names, llms, strict=True):
                totals[name] = [a + b for a, b in zip(totals[name], run(llm, p, args.max_tokens), strict=True)]
    rows, plain_round = [], None
    for name in names:
        row = {"config": name, **breakdown(totals[name], plain_round)}
        plain_round = plain_round or row["round_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"config": vars(args), "rows": rows}
    return write_result(result, args.out)


if __name__ == "__main__":
    main()
