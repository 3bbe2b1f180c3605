"""`specray bench easyspec`: EasySpec's layer-parallel drafting per draft and group size N, greedy
at batch 1 on Spec-Bench prompts: acceptance length and its drop against N = 1, draft time per
round (exact calibration step vs fuzzy steps), sequential attention steps per draft token, and
end-to-end tokens/s. One process: what the N attentions of a group would gain on N devices shows
in the sequential-step count, not in CPU time (docs/speculation.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from specray.cluster.args import out_folder, positive_int, positive_int_list, positive_ints_or_none
from specray.cluster.bench.prompts import SHARED_PROMPTS, load_prompts
from specray.kernels.chat import prompt_token_ids


def add_easyspec_parser(kinds) -> None:
    p = kinds.add_parser("easyspec", help="EasySpec layer-parallel drafting: drafts x group sizes, one run")
    p.add_argument("--model", default="smollm2-135m", help="target: alias, HF folder or .gguf file")
    p.add_argument("--drafts", default="smollm2-135m-draft,smollm2-135m@8,smollm2-135m@12",
                   help="comma-separated draft checkpoints; NAME@L keeps NAME's first L layers (the target "
                        "truncated: the paper's same-family draft without training)")
    p.add_argument("--sizes", type=positive_int_list, default=[1, 2, 3, 4], help="group sizes N (1: ordinary drafting)")
    p.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                   help="JSONL of prompts (default: Spec-Bench if present, else the packaged subset)")
    p.add_argument("--num-prompts", type=positive_int, default=8, help="prompts a draft")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="new tokens a prompt (greedy)")
    p.add_argument("--num-speculative-tokens", type=positive_int, default=3, help="draft tokens a round")
    p.add_argument("--group-workers", type=positive_ints_or_none, default=[],
                   help="also draft with a Ray draft group of W workers (gloo) at N = W, for each W given")
    p.add_argument("--out", type=out_folder, default="bench_out", help="folder for the report")
    p.set_defaults(func=cmd_bench_easyspec)


def draft_config(draft: str, size: int, k: int) -> dict:
    name, _, layers = draft.partition("@")
    cfg = {"method": "draft_model", "model": name, "num_speculative_tokens": k, "layer_parallel": size}
    if layers:
        cfg["draft_num_layers"] = int(layers)
    return cfg


def with_draft_group(llm, cfg: dict, workers: int):
    """Swap the in-process drafter of `llm` for a Ray draft group of `workers` ranks (local Ray)."""
    import ray

    from specray.cluster.config.speculative import SpeculativeConfig
    from specray.cluster.config.worker_specs import draft_spec
    from specray.cluster.pools.ray_pools import Placement, RayDraftPool
    from specray.cluster.router.router import Router

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=workers + 1, include_dashboard=False, log_to_driver=False)
    spec = draft_spec(SpeculativeConfig.from_dict(cfg), llm.model_name, "float32", "cpu", 16384, 16, 1)
    pool = RayDraftPool(spec, Placement({}), 120.0, group_size=workers)
    pool.ready()
    r = llm.router
    llm.router = Router(r.target, pool, llm.tokenizer, r.eos_token_ids, r.config)
    return pool


def measure(args, draft: str, size: int, encoded: list[list[int]], calibrate: bool = True,
            workers: int = 1) -> dict | None:
    """One (draft, N) row, or None where N does not fit the draft's middle layers. `calibrate`
    False keeps the fuzzy KV (what bonus calibration prevents; outputs stay lossless)."""
    from specray import LLM, SamplingParams
    from specray.kernels.drafters.draft_model import DraftTimes

    cfg = draft_config(draft, size, args.num_speculative_tokens)
    try:
        llm = LLM(args.model, speculative_config=cfg, enable_prefix_caching=False)  # sizes repeat the prompts
    except ValueError as e:
        if "exceeds the draft's" in str(e):
            return None
        raise
    pool = with_draft_group(llm, cfg, workers) if workers > 1 else None
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate({"prompt_token_ids": encoded[0]}, SamplingParams(temperature=0, max_tokens=8))  # warm-up
    drafter = llm.draft.drafter  # in-process; with a group its times stay 0
    drafter.calibrate_fuzzy_kv = calibrate
    drafter.times = DraftTimes()
    stats_before = llm.router.stats.draft_seconds
    start = time.perf_counter()
    outs = [llm.generate({"prompt_token_ids": ids}, sp)[0] for ids in encoded]
    seconds = time.perf_counter() - start
    if pool is not None:
        pool.close()
    rounds = sum(o.metrics.num_rounds for o in outs)
    layers = len(drafter.model.layers)
    groups = drafter.fuzzy.groups.sequential_steps if drafter.fuzzy is not None else layers
    k, t = args.num_speculative_tokens, drafter.times
    return {"draft": draft, "layers": layers, "N": size, "workers": workers, "calibrated": calibrate, "rounds": rounds,
            "acceptance_length": sum(o.metrics.num_emitted_tokens for o in outs) / rounds,
            "tokens_per_s": sum(len(o.outputs[0].token_ids) for o in outs) / seconds,
            "draft_ms_per_round": 1e3 * (llm.router.stats.draft_seconds - stats_before) / rounds,
            "calibration_ms_per_round": 1e3 * t.exact_seconds / t.exact_steps if t.exact_steps else None,
            "fuzzy_ms_per_step": 1e3 * t.fuzzy_seconds / t.fuzzy_steps if t.fuzzy_steps else None,
            "attention_steps_per_draft_token": (layers + (k - 1) * groups) / k,
            "greedy_tokens": [o.outputs[0].token_ids for o in outs]}


def cmd_bench_easyspec(args) -> int:
    from tqdm import tqdm

    from specray.kernels.loader import resolve

    tok = resolve(args.model).tokenizer()
    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)
    encoded = [prompt_token_ids(tok, p["prompt"]) for p in prompts]
    drafts = args.drafts.split(",")
    plan = [(d, n) for d in drafts for n in args.sizes]
    rows, skipped = [], []
    for d, n in tqdm(plan, desc="bench easyspec"):
        row = measure(args, d, n, encoded)
        rows.append(row) if row is not None else skipped.append(f"N={n} for {d}")
    if skipped:  # a size past a draft's middle layers; an empty report exited 0
        print(f"specray bench easyspec: skipped (the group size exceeds the draft's middle layers): "
              f"{', '.join(skipped)}", file=sys.stderr)
    if not rows:
        raise ValueError(f"no --sizes fit the drafts' middle layers ({', '.join(skipped)}): choose smaller sizes")
    for d in drafts:  # the effect of calibration: each draft's largest fitting N without it
        n = max((r["N"] for r in rows if r["draft"] == d), default=1)
        if n > 1:
            rows.append(measure(args, d, n, encoded, calibrate=False))
    for d in drafts:  # across workers: a Ray draft group of W ranks at N = W
        for w in args.group_workers:
            if (row := measure(args, d, w, encoded, workers=w)) is not None:
                rows.append(row)
    for row in rows:  # the drop against the same draft's N = 1, and losslessness
        base = next((r for r in rows if r["draft"] == row["draft"] and r["N"] == 1 and r["calibrated"]
                     and r["workers"] == 1), None)
        row["acceptance_drop"] = None if base is None else 1 - row["acceptance_length"] / base["acceptance_length"]
        row["greedy_matches_n1"] = None if base is None else row["greedy_tokens"] == base["greedy_tokens"]
    for row in rows:
        row.pop("greedy_tokens", None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": args.model, "num_prompts": len(encoded), "max_tokens": args.max_tokens,
              "num_speculative_tokens": args.num_speculative_tokens, "rows": rows}
    (out / "easyspec.json").write_text(json.dumps(report, indent=1))
    (out / "easyspec.md").write_text(markdown(report))
    plot(report, out / "easyspec.png")
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    head = ("| draft | layers | N | workers | calibrated | acceptance length | drop vs N=1 | attention steps / "
            "draft token | draft ms / round | calibration ms / round | fuzzy ms / step | tokens/s | greedy = N=1 |")
    lines = [f"model {report['model']}, {report['num_prompts']} prompts x {report['max_tokens']} tokens, "
             f"k = {report['num_speculative_tokens']}, greedy, batch 1", "", head, "|" + " --- |" * 13]
    for r in report["rows"]:
        drop = "" if r["acceptance_drop"] is None else f"{100 * r['acceptance_drop']:.1f} %"
        fuzzy = "" if r["fuzzy_ms_per_step"] is None else f"{r['fuzzy_ms_per_step']:.2f}"
        exact = "" if r["calibration_ms_per_round"] is None else f"{r['calibration_ms_per_round']:.2f}"
        lines.append(f"| {r['draft']} | {r['layers']} | {r['N']} | {r['workers']} | "
                     f"{'yes' if r['calibrated'] else 'no'} | {r['acceptance_length']:.3f} | {drop} | "
                     f"{r['attention_steps_per_draft_token']:.2f} | {r['draft_ms_per_round']:.2f} | "
                     f"{exact} | {fuzzy} | {r['tokens_per_s']:.1f} | "
                     f"{r['greedy_matches_n1']} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for draft in dict.fromkeys(r["draft"] for r in report["rows"]):
        rows = [r for r in report["rows"] if r["draft"] == draft and r["calibrated"] and r["workers"] == 1]
        left.plot([r["N"] for r in rows], [r["acceptance_length"] for r in rows], marker="o", label=draft)
        right.plot([r["N"] for r in rows], [r["attention_steps_per_draft_token"] for r in rows], marker="o",
                   label=draft)
    left.set(xlabel="group size N", ylabel="acceptance length", title="acceptance")
    right.set(xlabel="group size N", ylabel="sequential attention steps / draft token", title="draft depth")
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
