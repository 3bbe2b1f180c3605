"""`specray bench offline`: specray against transformers on the same prompts, machine and run.

Methods run round-robin per prompt, so machine noise hits them alike and ratios stay meaningful.
Writes JSON and a Markdown table. The bound is what memory bandwidth allows: one decode step
reads every weight once, so tokens/s <= acceptance length / (weight bytes / GEMV bandwidth).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

PACKAGED_PROMPTS = Path(__file__).parent / "data" / "spec_bench_subset.jsonl"
SHARED_PROMPTS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
METHODS = ("hf", "hf_prompt_lookup", "specray", "specray_ngram", "specray_draft")


@dataclass
class MethodResult:
    method: str
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance_length(self) -> float | None:
        return self.emitted / self.rounds if self.rounds else None


def load_prompts(path: Path | None, num: int) -> list[dict]:
    """First turns, taken round-robin across categories in file order (a fixed, documented subset)."""
    path = path or PACKAGED_PROMPTS
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r.get("category", "all"), []).append(r)
    picked, i = [], 0
    while len(picked) < min(num, len(rows)):
        for cat_rows in by_cat.values():
            if i < len(cat_rows) and len(picked) < num:
                picked.append({"category": cat_rows[i].get("category", "all"),
                               "prompt": cat_rows[i].get("prompt") or cat_rows[i]["turns"][0]})
        i += 1
    return picked


def gemv_seconds(model, repeats: int = 10) -> float:
    """Seconds to stream every weight matrix once through F.linear (one decode step's GEMVs)."""
    mats = [p for p in {id(p): p for p in model.parameters()}.values() if p.dim() == 2]
    mats = [m for m in mats if m is not model.embed_tokens or model.config.tie_word_embeddings]
    xs = {m.shape[1]: torch.randn(1, m.shape[1], dtype=m.dtype) for m in mats}
    run = lambda: [model.linear(xs[m.shape[1]], m) for m in mats]  # noqa: E731  (the layout decode uses)
    run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats


class Runner:
    """Builds each method once; `run(method, ids)` generates and returns (tokens, metrics)."""

    def __init__(self, args, methods):
        from specray import LLM
        from specray.kernels.loader import resolve

        self.args, self.ckpt = args, resolve(args.model)
        self.llms, self.hf = {}, None
        k = args.num_speculative_tokens
        configs = {"specray": None, "specray_ngram": {"method": "ngram", "num_speculative_tokens": k},
                   "specray_draft": {"method": "draft_model", "model": args.draft_model or args.model,
                                     "draft_num_layers": args.draft_num_layers, "num_speculative_tokens": k}}
        for m in methods:
            if m in configs:
                self.llms[m] = LLM(args.model, speculative_config=configs[m], max_num_seqs=1)
        if any(m.startswith("hf") for m in methods):
            from transformers import AutoModelForCausalLM

            self.hf = AutoModelForCausalLM.from_pretrained(self.ckpt.path, dtype=torch.float32).eval()

    def run(self, method: str, ids: list[int], max_tokens: int):
        if method in self.llms:
            from specray import SamplingParams

            out = self.llms[method].generate({"prompt_token_ids": ids},
                                             SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))[0]
            m = out.metrics
            return out.outputs[0].token_ids, (m.num_rounds, m.num_emitted_tokens, m.num_draft_tokens,
                                              m.num_accepted_tokens)
        kw = {"prompt_lookup_num_tokens": self.args.hf_prompt_lookup_tokens} if method == "hf_prompt_lookup" else {}
        return hf_greedy(self.hf, ids, max_tokens, **kw), (0, 0, 0, 0)


def hf_greedy(model, ids: list[int], max_tokens: int, **kw) -> list[int]:
    """transformers' greedy `generate` for exactly `max_tokens` tokens, EOS ignored like specray's
    `ignore_eos` (min_new_tokens would instead mask EOS out and change the argmax; an impossible
    eos_token_id just never stops; its warning is silenced)."""
    from transformers.utils import logging as hf_logging

    input_ids = torch.tensor([ids])
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the impossible eos_token_id is deliberate
    try:
        with torch.no_grad():
            gen = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                 max_new_tokens=max_tokens, eos_token_id=-1,
                                 pad_token_id=model.config.eos_token_id, **kw)
    finally:
        hf_logging.set_verbosity(verbosity)
    return gen[0, len(ids):].tolist()


def run_offline(args) -> dict:
    from tqdm import tqdm

    torch.set_num_threads(args.threads or torch.get_num_threads())
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)
    runner = Runner(args, methods)
    tok = runner.ckpt.tokenizer()
    encoded = [list(tok.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True))
               for p in prompts]
    results = {m: MethodResult(m) for m in methods}
    for m in methods:  # warm-up
        runner.run(m, encoded[0], 8)
    for ids in tqdm(encoded, desc="bench offline (prompts)"):
        for m in methods:
            start = time.perf_counter()
            out, (rounds, emitted, drafted, accepted) = runner.run(m, ids, args.max_tokens)
            r = results[m]
            r.seconds += time.perf_counter() - start
            r.tokens += len(out)
            r.rounds, r.emitted, r.drafted, r.accepted = (r.rounds + rounds, r.emitted + emitted,
                                                          r.drafted + drafted, r.accepted + accepted)
            r.outputs.append(out)
    target = next(iter(runner.llms.values())).target.model if runner.llms else None
    step_s = gemv_seconds(target) if target is not None else None
    return report(args, prompts, results, target, step_s)


def report(args, prompts, results, target, step_s) -> dict:
    base = results.get("hf")
    rows = []
    for r in results.values():
        tau = r.acceptance_length or 1.0
        bound = tau / step_s if step_s else None
        rows.append({
            "method": r.method, "tokens": r.tokens, "seconds": round(r.seconds, 3),
            "tokens_per_s": round(r.tokens_per_s, 2),
            "acceptance_length": None if r.acceptance_length is None else round(r.acceptance_length, 3),
            "acceptance_rate": round(r.accepted / r.drafted, 3) if r.drafted else None,
            "speedup_vs_hf": round(r.tokens_per_s / base.tokens_per_s, 3) if base else None,
            "bound_tokens_per_s": round(bound, 2) if bound else None,
            "fraction_of_bound": round(r.tokens_per_s / bound, 3) if bound else None,
            "greedy_matches_hf": (r.outputs == base.outputs) if base else None,
        })
    return {
        "schema": "specray.bench.offline/1",
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "model": args.model, "max_tokens": args.max_tokens, "batch_size": 1, "temperature": 0.0,
        "num_speculative_tokens": args.num_speculative_tokens,
        "prompts": [{"category": p["category"], "prompt": p["prompt"][:80]} for p in prompts],
        "weight_bytes": target.weight_bytes() if target is not None else None,
        "gemv_seconds_per_step": step_s,
        "gemv_bandwidth_gb_s": round(target.weight_bytes() / step_s / 1e9, 2) if step_s else None,
        "results": rows,
    }


def markdown(rep: dict) -> str:
    lines = [f"model {rep['model']}, batch 1, greedy, {rep['max_tokens']} new tokens, {len(rep['prompts'])} prompts; "
             f"GEMV bandwidth {rep['gemv_bandwidth_gb_s']} GB/s",
             "", "| method | tokens/s | acceptance length | acceptance rate | vs hf | bound tokens/s | of bound | = hf |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rep["results"]:
        cells = [r["method"], r["tokens_per_s"], r["acceptance_length"], r["acceptance_rate"], r["speedup_vs_hf"],
                 r["bound_tokens_per_s"], r["fraction_of_bound"], r["greedy_matches_hf"]]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def cmd_bench_offline(args) -> int:
    if args.quick:
        args.num_prompts, args.max_tokens = min(args.num_prompts, 4), min(args.max_tokens, 32)
    rep = run_offline(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "offline.json").write_text(json.dumps(rep, indent=2))
    (out / "offline.md").write_text(markdown(rep))
    print(markdown(rep))
    print(f"wrote {out / 'offline.json'} and {out / 'offline.md'}")
    return 0


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    off = kinds.add_parser("offline", help="batch-1 greedy: specray vs transformers, same run")
    off.add_argument("--model", default="smollm2-135m")
    off.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                     help="JSONL with Spec-Bench 'turns' or 'prompt' (default: Spec-Bench if present, else "
                          "the packaged subset)")
    off.add_argument("--num-prompts", type=int, default=12)
    off.add_argument("--max-tokens", type=int, default=128)
    off.add_argument("--methods", default=",".join(METHODS[:4]), help=f"comma-separated from {METHODS}")
    off.add_argument("--num-speculative-tokens", type=int, default=2)
    off.add_argument("--hf-prompt-lookup-tokens", type=int, default=10, help="transformers' prompt_lookup_num_tokens")
    off.add_argument("--draft-model", default=None)
    off.add_argument("--draft-num-layers", type=int, default=4)
    off.add_argument("--threads", type=int, default=None)
    off.add_argument("--quick", action="store_true", help="4 prompts, 32 tokens: a smoke run")
    off.add_argument("--out", default="bench_out")
    off.set_defaults(func=cmd_bench_offline)
