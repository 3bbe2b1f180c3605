"""What model-free drafting could accept on a model's own answers, before building it: greedy plain
answers to Spec-Bench prompts, replayed round by round as greedy verification would accept them.

Reports (1) the acceptance of prompt lookup by the length of the match it follows, and (2) for each
draft source, tau (tokens a round), verified rows a round and the speed-up those imply when a
verified row costs `--row-cost` of a decode step (the draft itself taken as free). Sources: prompt
lookup proposing a fixed k, or at most as many tokens as its match is long, and an index of the
earlier requests' answers (a cross-request cache: the suffix decoding idea) behind the lookup or alone.

    python benchmarks/lookup_sources.py --kernels fast --num-prompts 208 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from specray.kernels.kernel_modes import KERNEL_MODES

sys.path.insert(0, str(Path(__file__).parent))
from spec_args import prompts_with_categories, write_result  # noqa: E402

MAX_DRAFT = 8  # tokens a round the replay proposes at most
LONGEST = 6  # match lengths from this on share one bucket


class AnswerIndex:
    """n-grams of earlier requests' answers -> the latest answer and position they end at."""

    def __init__(self, min_n: int, max_n: int):
        assert 1 <= min_n <= max_n
        self.min_n, self.max_n = min_n, max_n
        self.ends: dict[tuple[int, ...], tuple[int, int]] = {}
        self.answers: list[list[int]] = []

    def add(self, answer: list[int]) -> None:
        a = len(self.answers)
        self.answers.append(answer)
        for n in range(self.min_n, self.max_n + 1):
            for end in range(n, len(answer)):
                self.ends[tuple(answer[end - n:end])] = (a, end)

    def propose(self, context: list[int], k: int) -> list[int]:
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            hit = self.ends.get(tuple(context[-n:]))
            if hit is not None:
                a, end = hit
                return self.answers[a][end:end + k]
        return []


def accepted(draft: list[int], answer: list[int], t: int) -> int:
    """How many of `draft` greedy verification accepts at answer position t."""
    n = 0
    for proposed, actual in zip(draft, answer[t:]):
        if proposed != actual:
            break
        n += 1
    return n


def replay(records: list[dict], lookup: tuple[int, int], propose, index: AnswerIndex | None = None) -> dict:
    """Every answer round by round: `propose((draft, match length))` of the prompt lookup with
    matches of `lookup` = (min, max) tokens -> the round's draft; the index, if any, proposes where
    the lookup found nothing and learns each answer once it is done (requests in `records`' order)."""
    from specray.kernels.drafters.ngram import lookup_match

    tokens = rounds = rows = 0
    for r in records:
        prompt, answer = r["prompt"], r["answer"]
        t = 0
        while t < len(answer):
            context = prompt + answer[:t]
            draft = propose(lookup_match(np.asarray(context, dtype=np.int64), MAX_DRAFT, *lookup))
            if not draft and index is not None:
                draft = index.propose(context, 4)
            t += accepted(draft, answer, t) + 1
            rounds += 1
            rows += len(draft)
        tokens += len(answer)
        if index is not None:
            index.add(answer)
    return {"tau": tokens / rounds, "rows_per_round": rows / rounds}


def by_match_length(records: list[dict]) -> dict[str, list[float]]:
    """Match length (1 .. LONGEST+) -> P(at least i of MAX_DRAFT lookup tokens accepted), i = 1..5,
    and the rounds behind it."""
    from specray.kernels.drafters.ngram import lookup_match

    counts: dict[int, list[int]] = {}
    for r in records:
        prompt, answer = r["prompt"], r["answer"]
        t = 0
        while t < len(answer):
            draft, n = lookup_match(np.asarray(prompt + answer[:t], dtype=np.int64), MAX_DRAFT, 1, 8)
            a = accepted(draft, answer, t)
            if draft:
                counts.setdefault(min(n, LONGEST), []).append(a)
            t += a + 1
    return {f"{n}+" if n == LONGEST else str(n): [len(c)] + [round(float(np.mean(np.array(c) >= i)), 3) for i in range(1, 6)]
            for n, c in sorted(counts.items())}


def _four(match):
    return match[0][:4]


SOURCES = {  # name -> (the lookup's match lengths, its draft from (draft, match length), the index's)
    "lookup, 4 tokens (matches of 2-4)": ((2, 4), _four, None),
    "lookup, 4 tokens (matches of 2-8)": ((2, 8), _four, None),
    "lookup, at most the match's length (2-8)": ((2, 8), lambda m: m[0][:m[1]], None),
    "lookup, then earlier answers (2-4)": ((2, 4), _four, (2, 4)),
    "lookup, then earlier answers (3-6)": ((2, 4), _four, (3, 6)),
    "earlier answers alone (2-4)": ((2, 4), lambda m: [], (2, 4)),
}


def answers(args) -> list[dict]:
    """Greedy plain answers (stopping at EOS) to the prompts, generated once and cached in --answers."""
    from specray import LLM, SamplingParams

    path = Path(args.answers) if args.answers else None
    if path and path.exists():
        return json.loads(path.read_text())
    ids, categories = prompts_with_categories(args)
    llm = LLM(args.model, max_num_seqs=16, kernels=args.kernels)
    outs = llm.generate([{"prompt_token_ids": p} for p in ids], SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    records = [{"category": c, "prompt": p, "answer": list(o.outputs[0].token_ids)}
               for c, p, o in zip(categories, ids, outs)]
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records))
    return records


def main(argv: list[str] | None = None) -> dict:
    from specray.cluster.bench.prompts import SHARED_PROMPTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                    help="JSONL of prompts (default: Spec-Bench if present, else the packaged subset)")
    ap.add_argument("--num-prompts", type=int, default=208, help="prompts, round-robin over categories")
    ap.add_argument("--max-tokens", type=int, default=128, help="answer length cap (answers stop at EOS)")
    ap.add_argument("--kernels", choices=list(KERNEL_MODES), default="fast", help="the target's CPU kernels")
    ap.add_argument("--row-cost", type=float, default=0.23,
                    help="a verified row's cost as a fraction of a decode step (docs/performance.md)")
    ap.add_argument("--answers", default=None, help="JSON cache of the answers (read if present, else written)")
    ap.add_argument("--out", default="bench_out/lookup_sources.json")
    args = ap.parse_args(argv)
    if args.num_prompts < 1 or args.max_tokens < 1 or args.row_cost < 0:
        raise SystemExit("need --num-prompts >= 1, --max-tokens >= 1 and --row-cost >= 0")
    records = answers(args)
    sources = {}
    for name, (lookup, propose, index) in SOURCES.items():
        row = replay(records, lookup, propose, AnswerIndex(*index) if index else None)
        row["speedup_bound"] = row["tau"] / (1 + args.row_cost * row["rows_per_round"])
        sources[name] = {k: round(v, 3) for k, v in row.items()}
        print(json.dumps({"source": name, **sources[name]}))
    result = {"prompts": len(records), "answer_tokens": sum(len(r["answer"]) for r in records),
              "row_cost": args.row_cost, "by_match_length": by_match_length(records), "sources": sources}
    print(json.dumps({"by_match_length": result["by_match_length"]}))
    return write_result(result, args.out)


if __name__ == "__main__":
    main()
