"""Measure a distilled draft on Spec-Bench prompts (greedy, batch 1, exactly N new tokens):
acceptance length per num_speculative_tokens, VocabTrim on/off, draft step cost relative to a target
step, and tokens/s of specray with the draft vs specray without speculation vs transformers
(plain and assisted generation with the same draft folder).

    python benchmarks/distill_draft.py --draft smollm2-135m-draft --num-prompts 4 --out bench_out/draft.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specray.cluster.args import int_list
from specray.kernels.chat import prompt_token_ids


def step_seconds(model, repeats: int = 30) -> float:
    """Median seconds of one batch-1 decode step (one token, short context) of a specray model."""
    from specray.kernels.batch import RaggedBatch, SeqChunk

    cache = model.make_cache(64)
    model(RaggedBatch.build([SeqChunk("s", list(range(3, 35)), 0)], cache), cache)
    cache.set_cached("s", 32)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        model(RaggedBatch.build([SeqChunk("s", [3 + i], 32)], cache), cache)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def speculate(llm, ids, sp: dict, k: int, want):
    """Every prompt at num_speculative_tokens k -> outputs, seconds, and the acceptance figures."""
    from specray import SamplingParams

    sampled = sp["temperature"] > 0  # seeded per prompt; exactness there is the statistical tests' job
    start = time.perf_counter()
    outs = [llm.generate({"prompt_token_ids": p}, SamplingParams(**sp, num_speculative_tokens=k,
                                                                 seed=i if sampled else None))[0]
            for i, p in enumerate(ids)]
    seconds = time.perf_counter() - start
    rounds = sum(o.metrics.num_rounds for o in outs)
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    return outs, seconds, {
        "acceptance_length": round(sum(o.metrics.num_emitted_tokens for o in outs) / max(rounds, 1), 3),
        "acceptance_rate": round(sum(o.metrics.num_accepted_tokens for o in outs) / max(drafted, 1), 3),
        "drafted_per_round": round(drafted / max(rounds, 1), 2),
        "lossless": None if sampled else all(o.outputs[0].token_ids == w for o, w in zip(outs, want, strict=True))}


def speculated_rows(model: str, config: dict, name: str, ks: list[int], ids, sp: dict, want, record,
                    extra=lambda llm, k, outs: {}) -> None:
    """One LLM with speculative_config `config`, warmed up, then one row per k (`extra` adds fields)."""
    from specray import LLM, SamplingParams

    llm = LLM(model, max_num_seqs=1, speculative_config=config)
    llm.generate({"prompt_token_ids": ids[0][:16]}, SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    for k in ks:
        outs, seconds, figures = speculate(llm, ids, sp, k, want)
        record(name, [o.outputs[0].token_ids for o in outs], seconds, k=k, **extra(llm, k, outs), **figures)


def tree_rows(args, ids, sp: dict, want, record) -> None:
    """The draft's trees (speculative_config['tree'] = --tree) at each depth in --tree-ks, alone and,
    with --lookup-first, behind prompt lookup; at most --tree-budget draft tokens verified a round."""
    tree = json.loads(args.tree)
    depths = [int(x) for x in args.tree_ks.split(",") if x]
    budget = {"verify_budget": args.tree_budget} if args.tree_budget else {}
    for lookup in (False, True) if args.lookup_first else (False,):
        config = {"method": args.method, "model": args.draft, "num_speculative_tokens": max(depths), "tree": tree,
                  **budget, **({"lookup_first": True} if lookup else {})}
        name = "specray + draft, lookup first, tree" if lookup else "specray + draft, tree"
        speculated_rows(args.model, config, name, depths, ids, sp, want, record,
                        lambda llm, k, outs: {"tree": tree, "verify_budget": args.tree_budget})


def eagle_step_seconds(folder, vocab_trim: int, repeats: int = 30) -> float:
    """Median seconds of one batch-1 step of a feature-level draft as specray runs it (Q8_0 weights,
    VocabTrim head): fc on [feature; embedding], the layer, the head."""
    from specray.kernels.drafters.loading import build_eagle
    from specray.kernels.drafters.options import DraftOptions

    drafter = build_eagle(DraftOptions("eagle", str(folder), num_blocks=8, draft_vocab_trim=vocab_trim))
    from specray.kernels.batch import SeqChunk

    h = drafter.model.config.hidden_size
    drafter.forward([SeqChunk("s", list(range(3, 35)), 0)], drafter.model.inputs(torch.randn(32, h), list(range(3, 35))))
    drafter.cache.set_cached("s", 32)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        drafter.forward([SeqChunk("s", [3 + i], 32)], drafter.model.inputs(torch.randn(1, h), [3 + i]))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def build_parser() -> argparse.ArgumentParser:
    from specray.cluster.bench.prompts import SHARED_PROMPTS

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-135m-draft")
    ap.add_argument("--method", default="draft_model", choices=["draft_model", "eagle"],
                    help="eagle: a feature-level draft (no transformers assisted baseline: it has no such mode)")
    ap.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                    help="JSONL of prompts (default: Spec-Bench if present, else the packaged subset)")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ks", default="2,3,4,5,6")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: seeded sampled requests (outputs are then not compared: the tests check sampling)")
    ap.add_argument("--trim-off-ks", default="3", help="ks also measured with VocabTrim off")
    ap.add_argument("--vocab-trim", type=int, default=None, help="default: the draft folder's k")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--lookup-first", action="store_true",
                    help="also measure speculative_config['lookup_first'] (prompt lookup, the draft elsewhere) per k")
    ap.add_argument("--lookup-ks", default=None, help="num_speculative_tokens for the lookup_first rows (default: --ks)")
    ap.add_argument("--lookup-model-tokens", type=int, default=None,
                    help="lookup_first model_tokens: the draft's chain length at most (default: k)")
    ap.add_argument("--tree", default=None,
                    help="also measure the draft's trees: a speculative_config['tree'] JSON, e.g. "
                         "'{\"kind\": \"topk\", \"k\": 3, \"width\": 4}' (EAGLE-2 style)")
    ap.add_argument("--tree-ks", default="6", help="tree depths (num_speculative_tokens) for the --tree rows")
    ap.add_argument("--tree-budget", type=int, default=None, help="verify_budget of the --tree rows")
    ap.add_argument("--ngram-ks", default="", help="also measure method ngram (prompt lookup alone) at these k")
    ap.add_argument("--out", default="bench_out/distill_draft.json")
    return ap


def plain_row(args, ids, sp: dict, record) -> tuple[list[list[int]], float]:
    """specray without speculation: the outputs every row is compared with, and its step time."""
    from specray import LLM, SamplingParams

    base = LLM(args.model, max_num_seqs=1)
    base.generate({"prompt_token_ids": ids[0][:16]}, SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    start = time.perf_counter()
    want = [base.generate({"prompt_token_ids": p}, SamplingParams(**sp, seed=i))[0].outputs[0].token_ids
            for i, p in enumerate(ids)]
    record("specray (no speculation)", want, time.perf_counter() - start)
    return want, step_seconds(base.target.model)


def draft_rows(args, ids, sp: dict, want, record) -> None:
    """The draft's chains per k (VocabTrim as configured, and off), behind lookup, and ngram alone."""
    for trim, k_list in ((args.vocab_trim, int_list(args.ks)), (0, int_list(args.trim_off_ks))):
        if k_list:
            config = {"method": args.method, "model": args.draft, "num_speculative_tokens": max(k_list),
                      "draft_vocab_trim": trim}
            speculated_rows(args.model, config, "specray + draft", k_list, ids, sp, want, record,
                            lambda llm, k, outs: {"vocab_trim": _trim_size(llm)})
    if args.lookup_first:
        lookup_ks = int_list(args.lookup_ks or args.ks)
        options = {"model_tokens": args.lookup_model_tokens} if args.lookup_model_tokens else True
        config = {"method": args.method, "model": args.draft, "num_speculative_tokens": max(lookup_ks),
                  "lookup_first": options}
        speculated_rows(args.model, config, "specray + draft, lookup first", lookup_ks, ids, sp, want, record,
                        lambda llm, k, outs: _lookup_share(llm, k, outs, args.lookup_model_tokens))
    if args.tree:
        tree_rows(args, ids, sp, want, record)
    if int_list(args.ngram_ks):
        config = {"method": "ngram", "num_speculative_tokens": max(int_list(args.ngram_ks))}
        speculated_rows(args.model, config, "specray ngram", int_list(args.ngram_ks), ids, sp, want, record)


def _trim_size(llm) -> int:
    ids = getattr(llm.draft.drafter, "token_ids", None)
    return 0 if ids is None else int(ids.numel())


def _lookup_share(llm, k: int, outs, model_tokens: int | None) -> dict:
    """The share of proposals the lookup made (the counters restart for the next k)."""
    drafter, rounds = llm.draft.drafter, sum(o.metrics.num_rounds for o in outs)
    share = round(drafter.lookup_rounds / max(rounds, 1), 3)
    drafter.lookup_rounds = drafter.model_rounds = 0
    return {"model_tokens": min(k, model_tokens or k), "lookup_share": share}


def step_ratios(args, target_step: float) -> dict:
    """A draft step's cost against a target step (full vocabulary, and VocabTrim's head)."""
    from specray.kernels.drafters.loading import default_vocab_trim
    from specray.kernels.drafters.vocab_trim import load_vocab_trim, trim_lm_head
    from specray.kernels.loader import load_model, resolve

    draft_ckpt = resolve(args.draft)
    out = {"target_step_ms": round(target_step * 1e3, 2)}
    if args.method == "eagle":
        k = default_vocab_trim(draft_ckpt.path) if args.vocab_trim is None else args.vocab_trim
        out[f"eagle_vocab_trim_{k}_ms"] = round(eagle_step_seconds(args.draft, k) * 1e3, 2)
        return out
    out["draft_full_vocab_ms"] = round(step_seconds(load_model(draft_ckpt)) * 1e3, 2)
    k = args.vocab_trim or default_vocab_trim(draft_ckpt.path) if args.vocab_trim != 0 else 0
    if k:
        trimmed = load_model(draft_ckpt, gemv_weights=False)
        trim_lm_head(trimmed, load_vocab_trim(draft_ckpt.path, k))
        trimmed.add_gemv_weights()
        out[f"draft_vocab_trim_{k}_ms"] = round(step_seconds(trimmed) * 1e3, 2)
    return out


def hf_rows(args, ids, want, record) -> None:
    """transformers generate, plain and assisted by the same draft folder (full vocabulary)."""
    from specray.cluster.bench.hf_baselines import hf_generate, load_hf
    from specray.kernels.loader import resolve

    hf = load_hf(resolve(args.model).path)
    assistant = load_hf(resolve(args.draft).path)
    hf_generate(hf, [ids[0][:16]], 4)
    for name, extra in (("transformers generate", {}),
                        ("transformers assisted (same draft, full vocabulary)", {"assistant_model": assistant})):
        start = time.perf_counter()
        outs = [hf_generate(hf, [p], args.max_tokens, **extra)[0] for p in ids]
        record(name, outs, time.perf_counter() - start, lossless=all(o == w for o, w in zip(outs, want, strict=True)))


def main(argv: list[str] | None = None) -> dict:
    from specray.cluster.bench.prompts import load_prompts
    from specray.kernels.loader import resolve

    args = build_parser().parse_args(argv)
    # the transformers rows decode greedily; transformers' assisted generation takes a standalone model only
    args.skip_hf = args.skip_hf or args.temperature > 0 or args.method == "eagle"
    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)
    tok = resolve(args.model).tokenizer()
    ids = [prompt_token_ids(tok, p["prompt"])
           for p in prompts]
    result = {"config": vars(args), "prompts": [p["prompt"][:80] for p in prompts], "runs": []}

    def record(name, outs_tokens, seconds, **extra):
        tokens = sum(len(o) for o in outs_tokens)
        row = {"method": name, "tokens": tokens, "seconds": round(seconds, 2),
               "tokens_per_s": round(tokens / seconds, 2), **extra}
        result["runs"].append(row)
        print(json.dumps(row), flush=True)

    sp = dict(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True)
    want, target_step = plain_row(args, ids, sp, record)
    draft_rows(args, ids, sp, want, record)
    result["draft_step_over_target_step"] = step_ratios(args, target_step)
    print(json.dumps(result["draft_step_over_target_step"]), flush=True)
    if not args.skip_hf:
        hf_rows(args, ids, want, record)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    import os

    torch.set_num_threads(int(os.environ.get("SPECRAY_BENCH_THREADS", min(2, torch.get_num_threads()))))
    main()
