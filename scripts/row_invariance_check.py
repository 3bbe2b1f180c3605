"""Are a verification step's rows computed exactly as one-row steps would compute them? (CPU or CUDA)

Greedy speculation equals greedy plain decoding only if the target's logits for a row do not depend
on how many rows its step holds. For each dtype: prefill a prompt, then for k = 2..MAX_ROWS take a
k-row step over the next k tokens and compare each row's logits with the one-row steps that decode
the same tokens one at a time: bitwise equal, the largest difference, and whether the argmax agrees.
`_library` rows run the same model with `row_invariant` off (kernels/invariant.py), `_padded` rows
pad every step to MAX_ROWS rows. Prints JSON and writes $OUT/row_invariance_<context>.json (or the cwd).

    python scripts/row_invariance_check.py --device cuda --dtypes float16,bfloat16,float32
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from specray.kernels.batch import RaggedBatch, SeqChunk
from specray.kernels.loader import load_model, resolve

MAX_ROWS = 8


def logits_of(model, cache, tokens: list[int], start: int, pad_to: int = 0) -> torch.Tensor:
    """One step of `tokens` after `start` cached tokens -> [len(tokens), vocab] fp32 logits.
    `pad_to`: filler rows after them up to that many (causal: the real rows never see them), so every
    step runs its matrix products at one row count."""
    device = model.embed_tokens.device
    if start:
        cache.set_cached("s", start)  # drop what a longer step wrote past it
    rows = tokens + [tokens[-1]] * max(pad_to - len(tokens), 0)
    out = model(RaggedBatch.build([SeqChunk("s", rows, start, num_logits=len(rows))], cache, device), cache)
    return out[:len(tokens)].float().cpu()


def check(model, prompt: list[int], follow: list[int], pad_to: int = 0) -> dict:
    cache = model.make_cache(64, block_size=16)
    base = len(prompt)
    logits_of(model, cache, prompt, 0)
    one = torch.cat([logits_of(model, cache, [t], base + i, pad_to) for i, t in enumerate(follow)])  # [MAX_ROWS, vocab]
    rows = {}
    for k in range(2, MAX_ROWS + 1):
        many = logits_of(model, cache, follow[:k], base, pad_to)  # [k, vocab]
        diff = (many - one[:k]).abs().amax(-1)  # [k]
        rows[k] = {"bitwise": bool(torch.equal(many, one[:k])), "max_abs_diff": float(diff.max()),
                   "argmax_agrees": bool(torch.equal(many.argmax(-1), one[:k].argmax(-1)))}
    return rows


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--context", type=int, default=0, help="tokens of context (default: a one-line prompt)")
    args = ap.parse_args()
    checkpoint = resolve(args.model)
    tok = checkpoint.tokenizer()
    line = "The capital of France is Paris. The capital of Germany is"
    prompt = tok(line).input_ids
    while len(prompt) < args.context:  # a long context of varied sentences
        prompt += tok(f" Sentence {len(prompt)} says that {len(prompt) % 7} cats met {len(prompt) % 11} dogs.").input_ids
    prompt = prompt[:max(args.context, len(prompt) if not args.context else 0)] + tok(" " + line).input_ids
    follow = tok(" Berlin. The capital of Italy is Rome, and of Spain").input_ids[:MAX_ROWS]
    out = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
           "torch": torch.__version__, "model": args.model, "context": len(prompt)}
    for name in args.dtypes.split(","):
        model = load_model(checkpoint, dtype=getattr(torch, name), device=args.device)
        out[name] = check(model, prompt, follow)
        out[f"{name}_padded"] = check(model, prompt, follow, pad_to=MAX_ROWS)
        model.row_invariant = False  # the library kernels at the step's own shapes (a draft's path)
        if args.device == "cpu":
            model.add_gemv_weights()
        out[f"{name}_library"] = check(model, prompt, follow)
        for key in (name, f"{name}_padded", f"{name}_library"):
            print(key, json.dumps(out[key]), flush=True)
    (Path(os.environ.get("OUT", ".")) / f"row_invariance_{len(prompt)}.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
