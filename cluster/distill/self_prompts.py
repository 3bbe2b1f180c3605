"""Prompts the target writes itself, for `specray distill --self-prompts N`.

An instruct model's chat template, cut where the user's text would begin, is a question to the
model: sampled from there, it writes a user turn, and its end-of-turn token closes it (the Magpie
recipe, Xu et al. 2024). The queries cover whatever the model saw in training, far more topics and
task shapes than a template x topic seed file, and nothing is downloaded or copied from a benchmark.
Only queries the model closed itself are kept (a run-on turn is mostly noise), without duplicates.
Written to a JSONL file as they come (a settings row, then prompts and draw counters), so a re-run
with the same settings reuses them and asks only for the rest.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SENTINEL = "\u2063specray-user-text\u2063"  # invisible separator: never in a real template


def pre_query_ids(tokenizer) -> list[int]:
    """The chat template's token ids up to where a user's message starts (system turn included),
    cut from the whole template's tokens: a token that the template merges with the user's first
    characters (e.g. a lone space) is left to the model to sample, as it is in real prompts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("--self-prompts needs a target with a chat template (it samples the user turn)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                         add_generation_prompt=False)
    if SENTINEL not in text:
        raise ValueError("--self-prompts: the chat template does not show the user's text")
    cut = text.index(SENTINEL)
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        whole = [int(t) for t in enc["input_ids"]]
        ids = [t for t, (_, end) in zip(whole, enc["offset_mapping"], strict=True) if end <= cut]
    else:  # no offsets: tokenise the cut text, and insist below that it is how the template starts
        whole = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
        ids = [int(t) for t in tokenizer(text[:cut], add_special_tokens=False)["input_ids"]]
    if not ids or whole[:len(ids)] != ids:
        raise ValueError("--self-prompts: no token prefix of the chat template ends before the user's text")
    return ids


def _read(path: Path, settings: dict) -> tuple[list[str], int]:
    """An earlier run's file -> (kept prompts, draws made); refused if made with other settings."""
    if not path.exists():
        return [], 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:  # only the last line may be cut short (a run stopped mid-write)
                raise ValueError(f"{path}: line {i + 1} is not JSON") from None
    if rows and rows[0].get("settings") != settings:
        raise ValueError(f"{path} was written with other settings ({rows[0].get('settings')}, now {settings}); "
                         "use a new --out")
    kept = [r["prompt"] for r in rows if "prompt" in r]
    return kept, max((r["draw"] for r in rows if "draw" in r), default=-1) + 1


def write_self_prompts(llm, path: Path, num: int, seed: int = 0, max_tokens: int = 96, temperature: float = 1.0,
                       top_p: float = 0.95, batch_size: int = 64, max_attempts: int | None = None,
                       progress=None) -> list[str]:
    """Sample until `path` holds `num` distinct, self-closed user queries of 3 words or more (or
    `max_attempts` draws, default 4 * num, ran out) -> the queries. Draw i is seeded with
    seed * 1_000_003 + i, so a re-run continues the same sequence of draws."""
    from specray.cluster.params import SamplingParams

    if num <= 0 or max_tokens <= 0 or batch_size <= 0:
        raise ValueError(f"--self-prompts must be positive, got {num} prompts of at most {max_tokens} tokens "
                         f"in batches of {batch_size}")
    path = Path(path)
    settings = {"model": getattr(llm, "model_name", None), "seed": seed, "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p}
    kept, draws = _read(path, settings)
    seen = set(kept)
    prefix = pre_query_ids(llm.get_tokenizer())
    budget = max_attempts if max_attempts is not None else 4 * num
    if progress is not None:
        progress.update(min(len(kept), num))
    with path.open("a") as f:
        if draws == 0 and not kept:
            f.write(json.dumps({"settings": settings}) + "\n")
        while len(kept) < num and draws < budget:
            group = range(draws, min(draws + batch_size, budget))
            params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                     seed=seed * 1_000_003 + i) for i in group]
            outs = llm.generate([{"prompt_token_ids": prefix}] * len(group), params)
            for i, o in zip(group, outs, strict=True):
                text = o.outputs[0].text.strip() if o.outputs[0].finish_reason == "stop" else ""
                if len(text.split()) < 3 or text in seen or len(kept) >= num:
                    continue
                seen.add(text)
                kept.append(text)
                f.write(json.dumps({"prompt": text, "draw": i}) + "\n")
                if progress is not None:
                    progress.update(1)
            draws = group.stop
            f.write(json.dumps({"draw": draws - 1}) + "\n")  # a re-run continues after the last draw
            f.flush()
    if not kept:
        raise ValueError(f"--self-prompts: none of {draws} sampled user turns was kept (closed by the "
                         "end-of-turn token, 3 words or more, distinct)")
    if len(kept) < num:
        print(f"specray distill: --self-prompts kept {len(kept)} of the {num} asked for after {draws} draws",
              file=sys.stderr, flush=True)
    return kept[:num]


def all_prompts(args, llm, out: Path) -> list[str]:
    """The seed file's prompts (unless only --self-prompts was asked for) plus those the target
    writes itself (OUT/self_prompts.jsonl), in one order shuffled with --seed."""
    from tqdm import tqdm

    from specray.cluster.distill.data import seed_prompts

    prompts = []
    if args.prompts or not args.self_prompts:
        prompts = seed_prompts(Path(args.prompts) if args.prompts else None, args.seed)
    if args.self_prompts:
        bar = tqdm(total=args.self_prompts, desc="distill (self-written prompts)", mininterval=5)
        prompts += write_self_prompts(llm, out / "self_prompts.jsonl", args.self_prompts, args.seed,
                                      max_tokens=args.self_prompt_max_tokens, batch_size=args.gen_batch_size,
                                      progress=bar)
        bar.close()
        random.Random(args.seed).shuffle(prompts)
    return prompts
