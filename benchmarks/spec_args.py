"""What the speculation benchmarks (paired_speedup.py, round_breakdown.py) share: their common
arguments, the configs they compare, and the prompts' token ids."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specray.kernels.kernel_modes import KERNEL_MODES


def add_common_args(ap: argparse.ArgumentParser, num_prompts: int, repeats: int, kernels: str) -> None:
    from specray.cluster.bench.prompts import SHARED_PROMPTS

    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--configs", required=True, help="JSON list of speculative_config dicts (plain runs too)")
    ap.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                    help="JSONL of prompts (default: Spec-Bench if present, else the packaged subset)")
    ap.add_argument("--num-prompts", type=int, default=num_prompts)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--kernels", choices=list(KERNEL_MODES), default=kernels, help="the target's CPU kernels")
    ap.add_argument("--device", default="cpu", help="torch device of the target and draft (cpu, cuda, cuda:1)")
    ap.add_argument("--dtype", default="float32", help="weights' dtype (float32, float16, bfloat16)")


def engine_args(args) -> dict:
    """The LLM keyword arguments every config of a run shares (no prefix caching: the repeats send the
    same prompts, which every pass must compute)."""
    return {"kernels": args.kernels, "device": args.device, "dtype": args.dtype, "enable_prefix_caching": False}


def configs_of(text: str) -> list[dict]:
    configs = json.loads(text)
    if not isinstance(configs, list) or not configs or not all(isinstance(c, dict) for c in configs):
        raise SystemExit("--configs must be a non-empty JSON list of speculative_config objects")
    return configs


def prompt_ids(args, raw: bool = False) -> list[list[int]]:
    """The first --num-prompts prompts of --dataset as token ids, chat-templated unless `raw`."""
    return prompts_with_categories(args, raw)[0]


def prompts_with_categories(args, raw: bool = False) -> tuple[list[list[int]], list[str]]:
    """`prompt_ids`, and each prompt's Spec-Bench category."""
    from specray.cluster.bench.prompts import load_prompts
    from specray.kernels.chat import prompt_token_ids
    from specray.kernels.loader import resolve

    tok = resolve(args.model).tokenizer()
    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)
    ids = [tok(p["prompt"]).input_ids if raw else prompt_token_ids(tok, p["prompt"]) for p in prompts]
    return ids, [p["category"] for p in prompts]


def write_result(result: dict, out: str) -> dict:
    """The result as JSON at `out` (folders made), said on stdout."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result
