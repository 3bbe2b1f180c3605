"""Write long-context prompts (2k-8k tokens) from Spec-Bench's news articles (summarization) and RAG
passages (Apache-2.0, cluster/bench/data/LICENSE.spec_bench): multi-document question answering (a
RAG question over its passage hidden among other articles) and multi-document summarisation (one
named article among several).

The benchmark set (`--split bench`) draws only on even-numbered articles and passages, the training
set (`--split train`, for `specray distill --kind longspec`) only on odd-numbered ones: the two never
share a document.

    python scripts/make_long_context.py --split bench --lengths 2048,4096,8192 --per-length 4 \
        --out cluster/bench/data/long_context.jsonl
    python scripts/make_long_context.py --split train --lengths 1536,2048,3072,4096 --per-length 16 \
        --out runs/longspec/long_tasks.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def documents(path: Path, split: str) -> tuple[list[str], list[tuple[str, str]]]:
    """-> articles, (passage, question) pairs of this split (even rows: bench, odd rows: train)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    parity = 0 if split == "bench" else 1
    articles = [r["turns"][0].removeprefix("Summarize:").strip() for r in rows if r["category"] == "summarization"]
    rag = [r["turns"][0].rsplit("\n", 1) for r in rows if r["category"] == "rag"]
    pick = lambda xs: [x for i, x in enumerate(xs) if i % 2 == parity]  # noqa: E731
    return pick(articles), [(p.strip(), q.strip()) for p, q in pick(rag)]


def render(docs: list[str], task: str) -> str:
    body = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(docs))
    return f"Read the documents below.\n\n{body}\n\n{task}"


HEADROOM = 256  # tokens left for the answer within the bucket's length (8192: SmolLM2's whole context)


def build(articles, rag, length: int, kind: str, rng: random.Random, count) -> dict:
    """Documents added while the prompt stays within `length - HEADROOM` tokens."""
    pool = list(articles)
    rng.shuffle(pool)
    if kind == "qa":
        passage, question = rag[rng.randrange(len(rag))]
        docs, task = [passage], f"Using only the documents above, answer: {question}"
    else:
        docs, task = [], None
    for article in pool:
        trial = docs + [article]
        if kind == "qa":
            rng.shuffle(trial)
        text = render(trial, task or f"Summarize Document {rng.randint(1, len(trial))} in three sentences.")
        if count(text) > length - HEADROOM:
            continue
        docs = trial
        prompt, tokens = text, count(text)
    if not docs or (kind == "qa" and len(docs) < 2):
        raise SystemExit(f"no {kind} prompt fits in {length - HEADROOM} tokens: raise --lengths")
    return {"category": f"long_{length // 1024}k_{kind}", "context_tokens": tokens, "prompt": prompt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec-bench", default=str(SPEC_BENCH), help="Spec-Bench question.jsonl")
    ap.add_argument("--split", choices=["bench", "train"], required=True)
    ap.add_argument("--lengths", default="2048,4096,8192", help="prompt tokens at most, comma-separated")
    ap.add_argument("--per-length", type=int, default=4, help="prompts per length (half QA, half summaries)")
    ap.add_argument("--model", default="smollm2-135m", help="whose tokenizer and chat template count tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from specray.kernels.chat import prompt_token_ids
    from specray.kernels.loader import resolve

    tok = resolve(args.model).tokenizer()
    count = lambda text: len(prompt_token_ids(tok, text))  # noqa: E731
    articles, rag = documents(Path(args.spec_bench), args.split)
    rng = random.Random(args.seed)
    rows = [build(articles, rag, length, ("qa", "summary")[i % 2], rng, count)
            for length in map(int, args.lengths.split(",")) for i in range(args.per_length)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}: " + ", ".join(str(r["context_tokens"]) for r in rows))


if __name__ == "__main__":
    main()
