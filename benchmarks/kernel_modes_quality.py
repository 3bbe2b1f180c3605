"""A kernel mode's quality against the exact mode on SmolLM2-135M (`--mode`: fast or fast16):
teacher-forced top-1 agreement, KL(exact || mode) and negative log-likelihood on the exact mode's
greedy continuations of chat prompts, and where the two modes' greedy outputs first differ.

    python benchmarks/kernel_modes_quality.py --mode fast16 --num-prompts 16 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specray import LLM, SamplingParams
from specray.cluster.bench.prompts import load_prompts
from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.kernel_modes import FAST_PARTS
from specray.kernels.loader import load_model, resolve


def teacher_forced(models: dict, prompt: list[int], continuation: list[int]) -> dict:
    """-> log-probabilities [len(continuation), vocab] of every continuation position, per mode."""
    seq, out = prompt + continuation, {}
    for mode, model in models.items():
        cache = model.make_cache(ceil_blocks(len(seq)), 16)
        logits = model(RaggedBatch.build([SeqChunk("s", seq, 0, num_logits=len(seq))], cache), cache)
        out[mode] = torch.log_softmax(logits[len(prompt) - 1:-1].double(), -1)  # [len(continuation), vocab]
    return out


def ceil_blocks(tokens: int) -> int:
    return tokens // 16 + 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", default=None, help="JSONL of prompts (default: the packaged subset)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--mode", choices=list(FAST_PARTS), default="fast", help="the kernel mode set against exact")
    args = ap.parse_args()
    exact_llm, fast_llm = LLM(args.model, kernels="exact"), LLM(args.model, kernels=args.mode)
    prompts = [exact_llm.apply_chat_template([{"role": "user", "content": p["prompt"]}])
               for p in load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    exact = [o.outputs[0].token_ids for o in exact_llm.generate(inputs, params)]
    fast = [o.outputs[0].token_ids for o in fast_llm.generate(inputs, params)]
    mode = args.mode
    models = {"exact": load_model(resolve(args.model), kernels="exact"), mode: load_model(resolve(args.model), kernels=mode)}
    agree = positions = 0
    kl = 0.0
    nll = {"exact": 0.0, mode: 0.0}
    for prompt, continuation in zip(prompts, exact):
        lp = teacher_forced(models, prompt, continuation)
        target = torch.tensor(continuation)[:, None]
        agree += int((lp["exact"].argmax(-1) == lp[mode].argmax(-1)).sum())
        positions += len(continuation)
        kl += float((lp["exact"].exp() * (lp["exact"] - lp[mode])).sum())
        for mode in nll:
            nll[mode] -= float(lp[mode].gather(1, target).sum())
    first_difference = sorted(next((i for i, (a, b) in enumerate(zip(e, f)) if a != b), min(len(e), len(f)))
                              for e, f in zip(exact, fast))
    print(json.dumps({"mode": args.mode, "prompts": len(prompts), "positions": positions, "top1_agreement": round(agree / positions, 4),
                      f"kl_exact_{mode}_per_token": float(f"{kl / positions:.3g}"),
                      "nll_per_token": {m: round(v / positions, 4) for m, v in nll.items()},
                      "greedy_outputs_equal": sum(e == f for e, f in zip(exact, fast)),
                      "first_difference_median": first_difference[len(first_difference) // 2]}, indent=1))


if __name__ == "__main__":
    main()
