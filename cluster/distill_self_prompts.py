"""Prompts the target writes itself, for `specray distill --self-prompts N`.

An instruct model's chat template, cut where the user's text would begin, is a question to the
model: sampled from there, it writes a user turn, and its end-of-turn token closes it (the Magpie
recipe, Xu et al. 2024). The queries cover whatever the model saw in training, far more topics and
task shapes than a template x topic seed file, and nothing is downloaded or copied from a benchmark.
Only queries the model closed itself are kept (a run-on turn is mostly noise), without duplicates.
Written to a JSONL file one query at a time, so a re-run reuses them and asks only for the rest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SENTINEL = "\u2063specray-user-text\u2063"  # invisible separator: never in a real template


def pre_query_ids(tokenizer) -> list[int]:
    """The chat template's token ids up to where a user's message starts (system turn included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("--self-prompts needs a target with a chat template (it samples the user turn)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                         add_generation_prompt=False)
    if SENTINEL not in text:
        raise ValueError("--self-prompts: the chat template does not show the user's text")
    ids = tokenizer(text.split(SENTINEL)[0], add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("--self-prompts: the chat template puts nothing before the user's text")
    return [int(t) for t in ids]


def _clean(text: str) -> str | None:
    text = text.strip()
    return text if len(text.split()) >= 3 else None


def write_self_prompts(llm, path: Path, num: int, seed: int = 0, max_tokens: int = 96, temperature: float = 1.0,
                       top_p: float = 0.95, batch_size: int = 64, max_attempts: int | None = None,
                       progress=None) -> list[str]:
    """Sample until `path` holds `num` distinct, self-closed user queries (or `max_attempts` draws,
    default 4 * num, ran out) -> the queries. Draw i is seeded with seed * 1_000_003 + i, so a
    resumed run continues the same sequence of draws."""
    from specray.cluster.params import SamplingParams

    if num <= 0:
        raise ValueError(f"--self-prompts must be positive, got {num}")
    path = Path(path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    kept = [r["prompt"] for r in rows if "prompt" in r]
    draws = max((r.get("draw", -1) for r in rows), default=-1) + 1
    seen = set(kept)
    prefix = pre_query_ids(llm.get_tokenizer())
    budget = max_attempts if max_attempts is not None else 4 * num
    if progress is not None:
        progress.update(min(len(kept), num))
    with path.open("a") as f:
        while len(kept) < num and draws < budget:
            group = range(draws, min(draws + batch_size, budget))
            params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                                     seed=seed * 1_000_003 + i) for i in group]
            outs = llm.generate([{"prompt_token_ids": prefix}] * len(group), params)
            for i, o in zip(group, outs, strict=True):
                text = _clean(o.outputs[0].text) if o.outputs[0].finish_reason == "stop" else None
                if text is None or text in seen or len(kept) >= num:
                    continue
                seen.add(text)
                kept.append(text)
                f.write(json.dumps({"prompt": text, "draw": i}) + "\n")
                if progress is not None:
                    progress.update(1)
            f.flush()
            draws = group.stop
            if len(kept) < num:  # the draw counter must survive a resume even when a group kept nothing
                f.write(json.dumps({"draw": draws - 1}) + "\n")
    if not kept:
        raise ValueError(f"--self-prompts: none of {draws} sampled user turns ended with the end-of-turn token")
    if len(kept) < num:
        print(f"specray distill: --self-prompts kept {len(kept)} of the {num} asked for after {draws} draws",
              file=sys.stderr, flush=True)
    return kept[:num]
