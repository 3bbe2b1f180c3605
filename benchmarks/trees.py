"""Tree and multi-draft speculation on the real model: chain, RSD-C, RSD-S, SpecTr, top-k tree and
ADED, at equal depth and at an equal verified-token budget, temperature 0 and 1, batch 1.

Reports acceptance length (tokens emitted per round), draft tokens verified per round and tokens/s.
Methods run round-robin per prompt, so machine noise hits them alike; ratios are to the chain of
the same comparison (same depth, or same budget) in the same run.

    python benchmarks/trees.py --draft smollm2-135m-draft --num-prompts 4 --max-tokens 64 --out bench_out/trees.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specray.kernels.chat import prompt_token_ids


def configs(draft: str, depth: int, budget: int, method: str = "draft_model") -> dict[str, dict | None]:
    """name -> speculative_config; `depth/...` share the depth, `budget/...` verify at most `budget` tokens.
    `method`: the chain's and the trees' drafter (draft_model, or eagle for a feature-level draft)."""
    from specray.cluster.bench.methods import tree_shapes

    chain = {"method": method, "model": draft}
    out: dict[str, dict | None] = {"none": None}
    for group, k, cap in (("depth", depth, None), ("budget", depth + 1, budget)):
        trees = tree_shapes(k)
        capped = {"verify_budget": cap} if cap else {}
        out[f"{group}/chain"] = {**chain, "num_speculative_tokens": cap or k}
        for name, tree in trees.items():
            out[f"{group}/{name}"] = {**chain, "num_speculative_tokens": k, "tree": tree, **capped}
        out[f"{group}/aded"] = {"method": "aded", "num_speculative_tokens": k, **capped}
    return out


def run(args) -> dict:
    from specray import LLM, SamplingParams
    from specray.cluster.bench.prompts import load_prompts
    from specray.kernels.loader import resolve

    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)
    tok = resolve(args.model).tokenizer()
    ids = [prompt_token_ids(tok, p["prompt"])
           for p in prompts]
    specs = configs(args.draft, args.depth, args.budget, args.method)
    llms = {name: LLM(args.model, speculative_config=spec, max_num_seqs=1, kv_cache_tokens=args.kv_cache_tokens,
                      enable_prefix_caching=False)
            for name, spec in specs.items()}
    cells = {(n, t): {"tokens": 0, "seconds": 0.0, "rounds": 0, "emitted": 0, "drafted": 0}
             for n in specs for t in args.temperatures}
    for t in args.temperatures:
        for i, prompt in enumerate(ids):
            for name, llm in llms.items():  # round-robin: every method sees the same noise
                params = SamplingParams(temperature=t, max_tokens=args.max_tokens, ignore_eos=True, seed=i)
                start = time.perf_counter()
                (out,) = llm.generate([{"prompt_token_ids": prompt}], params)
                cell, m = cells[(name, t)], out.metrics
                cell["seconds"] += time.perf_counter() - start
                cell["tokens"] += len(out.outputs[0].token_ids)
                cell["rounds"] += m.num_rounds
                cell["emitted"] += m.num_emitted_tokens
                cell["drafted"] += m.num_draft_tokens
            print(f"temperature {t}: prompt {i + 1}/{len(ids)} done", flush=True)
    rows = [{"method": n, "temperature": t, **c, "tokens_per_s": c["tokens"] / c["seconds"],
             "acceptance_length": c["emitted"] / c["rounds"] if c["rounds"] else 1.0,
             "verified_per_round": c["drafted"] / c["rounds"] if c["rounds"] else 0.0}
            for (n, t), c in cells.items()]
    return {"config": vars(args), "speculative_configs": specs, "rows": rows}


def markdown(report: dict) -> str:
    speed = {(r["method"], r["temperature"]): r["tokens_per_s"] for r in report["rows"]}
    lines = ["| method | temperature | tokens/s | vs chain | vs no speculation | acceptance length | "
             "draft tokens verified / round |", "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        t, tps = r["temperature"], r["tokens_per_s"]
        chain = speed.get((f"{r['method'].split('/')[0]}/chain", t))
        vs_chain = f"{tps / chain:.2f}x" if chain else "-"
        lines.append(f"| {r['method']} | {t} | {tps:.2f} | {vs_chain} | {tps / speed[('none', t)]:.2f}x | "
                     f"{r['acceptance_length']:.3f} | {r['verified_per_round']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from specray.cluster.args import float_list
    from specray.cluster.bench.prompts import SHARED_PROMPTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-135m-draft", help="draft for the chain and the trees")
    ap.add_argument("--method", default="draft_model", choices=["draft_model", "eagle"],
                    help="the draft's kind: a standalone model or a feature-level (eagle) draft")
    ap.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None)
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--depth", type=int, default=3, help="depth of every method in the equal-depth comparison")
    ap.add_argument("--budget", type=int, default=6, help="draft tokens verified per round, equal-budget comparison")
    ap.add_argument("--temperatures", type=float_list, default=[0.0, 1.0])
    ap.add_argument("--kv-cache-tokens", type=int, default=4096)
    ap.add_argument("--out", default="bench_out/trees.json")
    args = ap.parse_args()
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
