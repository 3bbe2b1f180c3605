"""Benchmark output: JSON (schema below), a Markdown table and PNG plots.

JSON schema `specray.bench.offline/6` (/5 had no decode-only rate, no `_fast` methods and no
llama.cpp ratios; /4 had no arithmetic floor nor raw counts, and bounds at batch 1 only):
- `config`: model, max_tokens, num_speculative_tokens, draft_num_layers, draft_model (null: the
  target, truncated), eagle_model (also the trees' drafter; null: trees use the draft model),
  batch_sizes, temperatures, methods,
  sequences_per_batch {batch size: sequences a group really held (min of it and the prompts)};
- `machine`: platform, torch version, threads; `prompts`: [{category, prompt (first 80 chars)}];
- `bandwidth`: weight_bytes (read by a decode step; packed weights at their packed size),
  gemv_gb_per_s (one-row fp32 MKL GEMVs over every weight, this run), stream_gb_per_s (a plain read
  of a 256 MB buffer, this run), gb_per_s (the larger: the bound's), seconds_per_step (weight_bytes
  / gb_per_s: the bound's step time), hot_gemv_seconds_per_step (the step's projections with their
  weights in cache: its arithmetic alone, `bench_bound`), roofline_seconds_per_step (the larger of
  the two), limited_by ("memory" or "compute"). /3 had the GEMV alone, which on some CPUs reads at
  half the memory's speed and so flattered every fraction; /2 timed the model's own GEMVs;
- `cells`: one per (method, batch_size, temperature): `skipped` (reason or null), requests, tokens,
  seconds, tokens_per_s, rounds / emitted / drafted / accepted (specray: summed over its sequences;
  emitted = tokens - requests, as each request's first token comes from its prefill), acceptance_length (emitted per round), acceptance_rate (accepted/drafted),
  draft_ms_per_round, verify_ms_per_round, speedup_vs_hf (vs transformers plain, same batch size and
  temperature), bound_tokens_per_s and fraction_of_bound (sequences a group holds x
  acceptance length / seconds_per_step; a step reads the weights once for the whole group, and its
  KV reads are left out, so large batches overstate the bound), roofline_tokens_per_s and
  fraction_of_roofline (batch 1: acceptance length / roofline_seconds_per_step),
  greedy_matches_hf (batch 1, temperature 0; exact kernels only), greedy_matches_plain (temperature 0:
  equal to specray's plain decoding in the same kernel mode and batch size), decode_tokens_per_s
  (batch 1: tokens after the first over the time outside prefill steps, what llama-bench and
  llama-lookup report), per_category {category: tokens_per_s} (batch 1). A method ending in
  `_fast` (`_fast16`) is its engine with the fast (fast16) kernels (kernels/fast_linear.py);
- `long_context` (prompts with `context_tokens` only, cluster/bench/long_context.py): per method,
  temperature and context length at batch 1: decode_tokens_per_s and ms_per_round (prefill steps
  left out), prefill_s per request, acceptance_length, draft_own_mib and target_kv_mirror_mib per
  sequence at that length;
- `summary`: the headline ratios (each null when its cells are missing); the llama.cpp ones compare
  decode-only rates at batch 1 (specray's plain: the faster kernel mode) and tokens/s at batch 16;
- `partial`: true while the run is still going (written after every finished (batch size,
  temperature) row, so a stopped run keeps its rows), false in the final file.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from specray.cluster.bench.methods import METHODS, base_method, kernels_of

SCHEMA = "specray.bench.offline/6"
LLAMA_BATCH1 = ("llama_bench", "llama_lookup", "llama_speculative")  # llama.cpp's decode-only batch-1 rows


def decode_tokens_per_s(cell) -> float | None:
    """Batch 1: tokens after the first over the time outside prefill steps (what llama-bench,
    llama-lookup and llama-speculative-simple report); llama.cpp rows are decode-only already."""
    if cell.batch_size != 1 or not cell.seconds:
        return None
    if cell.method in LLAMA_BATCH1:
        return cell.tokens / cell.seconds
    if not cell.method.startswith("specray") or cell.seconds <= cell.prefill_seconds:
        return None
    return cell.emitted / (cell.seconds - cell.prefill_seconds)


def cell_json(cell, hf_cell, step_s: float | None, roofline_s: float | None = None, plain_cell=None) -> dict:
    """`plain_cell`: specray's plain decoding in the same kernel mode, batch size and temperature."""
    out = {"method": cell.method, "batch_size": cell.batch_size, "temperature": cell.temperature,
           "skipped": cell.skipped}
    if cell.skipped:
        return out
    tps = cell.tokens / cell.seconds if cell.seconds else 0.0
    decode = decode_tokens_per_s(cell)
    exact = kernels_of(cell.method) == "exact"
    tau = cell.emitted / cell.rounds if cell.rounds else None
    sequences = min(cell.batch_size, cell.requests)  # a step reads the weights once for all of them
    bound = sequences * (tau or 1.0) / step_s if step_s else None
    roofline = (tau or 1.0) / roofline_s if roofline_s and cell.batch_size == 1 else None
    out.update(
        requests=cell.requests, tokens=cell.tokens, seconds=round(cell.seconds, 6), tokens_per_s=round(tps, 2),
        rounds=cell.rounds, emitted=cell.emitted, drafted=cell.drafted, accepted=cell.accepted,
        acceptance_length=round(tau, 3) if tau else None,
        acceptance_rate=round(cell.accepted / cell.drafted, 3) if cell.drafted else None,
        draft_ms_per_round=round(1e3 * cell.draft_seconds / cell.steps, 2) if cell.steps else None,
        verify_ms_per_round=round(1e3 * cell.target_seconds / cell.steps, 2) if cell.steps else None,
        speedup_vs_hf=round(tps * hf_cell.seconds / hf_cell.tokens, 3) if hf_cell and hf_cell.tokens else None,
        bound_tokens_per_s=round(bound, 2) if bound else None,
        fraction_of_bound=round(tps / bound, 3) if bound else None,
        roofline_tokens_per_s=round(roofline, 2) if roofline else None,
        fraction_of_roofline=round(tps / roofline, 3) if roofline else None,
        decode_tokens_per_s=round(decode, 2) if decode else None,
        greedy_matches_hf=(cell.outputs == hf_cell.outputs) if hf_cell and cell.batch_size == 1 and exact
        and cell.temperature == 0 and cell.method != "hf" and not cell.method.startswith("llama") else None,
        # lossless in every kernel mode: greedy output = plain greedy output of the same mode
        greedy_matches_plain=(cell.outputs == plain_cell.outputs) if plain_cell is not None and plain_cell is not cell
        and cell.temperature == 0 and plain_cell.outputs else None,
        per_category={c: round(n.tokens / n.seconds, 2) for c, n in cell.per_category.items() if n.seconds} or None,
    )
    return out


def summary(rows: list[dict]) -> dict:
    def tps(method, batch, temp=0.0):
        return next((r["tokens_per_s"] for r in rows if r["method"] == method and r["batch_size"] == batch
                     and r["temperature"] == temp and not r["skipped"]), None)

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    at1 = [r for r in rows if r["batch_size"] == 1 and r["temperature"] == 0 and not r["skipped"]]
    best_specray = max((r for r in at1 if r["method"].startswith("specray")), key=lambda r: r["tokens_per_s"], default=None)
    best_hf = max((r for r in at1 if r["method"].startswith("hf")), key=lambda r: r["tokens_per_s"], default=None)

    def decode(method):
        return next((r["decode_tokens_per_s"] for r in at1 if r["method"] == method), None)

    def best_decode(prefix):
        return max((r["decode_tokens_per_s"] or 0 for r in at1 if r["method"].startswith(prefix)), default=None)

    plain = max(decode("specray") or 0, decode("specray_fast16") or 0, decode("specray_fast") or 0) or None
    # the default against plain in the same kernels: the product's default mode (fast16 for a GGUF on a
    # CPU) where the run has it, else exact, else fast
    suffix = next((s for s in ("_fast16", "", "_fast") if decode(f"specray_default{s}") and decode(f"specray{s}")), "")
    return {
        "default_speculation_vs_plain_batch1": ratio(decode(f"specray_default{suffix}"), decode(f"specray{suffix}")),
        # batch 1, decode-only (llama.cpp's batch-1 tools report decode alone), greedy
        "specray_plain_vs_llama_bench_batch1": ratio(plain, decode("llama_bench")),
        "best_specray_vs_best_llama_batch1": ratio(best_decode("specray"), best_decode("llama")),
        "best_specray_vs_specray_plain_batch1": ratio(best_decode("specray"), plain),
        "specray_vs_llama_batched_16": ratio(max(tps(m, 16) or 0 for m in ("specray", "specray_fast16", "specray_fast")) or None,
                                             tps("llama_batched", 16)),
        "specray_plain_vs_hf_plain_batch1": ratio(tps("specray", 1), tps("hf", 1)),
        "best_specray_method_batch1": best_specray["method"] if best_specray else None,
        "best_specray_vs_best_hf_batch1": ratio(best_specray and best_specray["tokens_per_s"],
                                                best_hf and best_hf["tokens_per_s"]),
        "best_specray_fraction_of_bound_batch1": best_specray and best_specray["fraction_of_bound"],
        "best_specray_fraction_of_roofline_batch1": best_specray and best_specray["fraction_of_roofline"],
        "ragged_vs_padded_draft_batch16": ratio(tps("specray_draft", 16), tps("specray_draft_padded", 16)),
        "ragged_vs_padded_ngram_batch16": ratio(tps("specray_ngram", 16), tps("specray_ngram_padded", 16)),
    }


def bandwidth_json(bw) -> dict:
    if bw is None:  # no specray engine in the run: no bound
        return {"weight_bytes": None, "gemv_gb_per_s": None, "stream_gb_per_s": None, "gb_per_s": None,
                "seconds_per_step": None, "hot_gemv_seconds_per_step": None, "roofline_seconds_per_step": None,
                "limited_by": None}
    return {"weight_bytes": bw.weight_bytes, "gemv_gb_per_s": round(bw.gemv_bytes_per_s / 1e9, 2),
            "stream_gb_per_s": round(bw.stream_bytes_per_s / 1e9, 2),
            "gb_per_s": round(max(bw.gemv_bytes_per_s, bw.stream_bytes_per_s) / 1e9, 2),
            "seconds_per_step": bw.step_s, "hot_gemv_seconds_per_step": bw.hot_gemv_s,
            "roofline_seconds_per_step": bw.roofline_step_s, "limited_by": bw.limited_by}


def build_report(args, cells, prompts, bandwidth, partial: bool = False) -> dict:
    """`bandwidth`: a `bench_offline.Bandwidth` (None when no specray engine ran)."""
    hf = {(c.batch_size, c.temperature): c for c in cells if c.method == "hf" and not c.skipped}
    step_s = bandwidth.step_s if bandwidth is not None else None
    roofline_s = bandwidth.roofline_step_s if bandwidth is not None else None
    plain = {(kernels_of(c.method), c.batch_size, c.temperature): c for c in cells
             if base_method(c.method) == "specray" and not c.skipped}
    rows = [cell_json(c, hf.get((c.batch_size, c.temperature)), step_s, roofline_s,
                      plain.get((kernels_of(c.method), c.batch_size, c.temperature))
                      if c.method.startswith("specray") else None) for c in cells]
    return {
        "schema": SCHEMA,
        "config": {"model": args.model, "max_tokens": args.max_tokens, "methods": args.methods.split(","),
                   "batch_sizes": args.batch_sizes, "temperatures": args.temperatures,
                   "num_speculative_tokens": args.num_speculative_tokens, "draft_num_layers": args.draft_num_layers,
                   "draft_model": args.draft_model, "eagle_model": args.eagle_model,
                   # what each batch-size row really ran at once: fewer prompts than the batch size cap it
                   "sequences_per_batch": {b: min(b, len(prompts)) for b in args.batch_sizes}},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "prompts": [{"category": p["category"], "prompt": p["prompt"][:80]} for p in prompts],
        "bandwidth": bandwidth_json(bandwidth),
        "cells": rows,
        "summary": summary(rows),
        "partial": partial,
    }


COLUMNS = ("temperature", "batch_size", "method", "tokens_per_s", "decode_tokens_per_s", "acceptance_length", "acceptance_rate",
           "draft_ms_per_round", "verify_ms_per_round", "speedup_vs_hf", "fraction_of_bound", "fraction_of_roofline",
           "greedy_matches_hf", "greedy_matches_plain")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.2f}"


def markdown(report: dict) -> str:
    cfg, bw = report["config"], report["bandwidth"]
    lines = [f"model {cfg['model']}, {cfg['max_tokens']} new tokens, {len(report['prompts'])} prompts, "
             f"k = {cfg['num_speculative_tokens']}; bandwidth {bw['gb_per_s']} GB/s (plain read "
             f"{bw['stream_gb_per_s']}, fp32 GEMV {bw['gemv_gb_per_s']}), {bw['weight_bytes']} weight bytes a step; "
             f"step at least {_ms(bw['seconds_per_step'])} ms by memory, {_ms(bw['hot_gemv_seconds_per_step'])} ms "
             f"by the projections' arithmetic (weights in cache): {bw['limited_by']}-bound",
             "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in report["cells"]:
        if not r["skipped"]:
            lines.append("| " + " | ".join("-" if r.get(c) is None else str(r[c]) for c in COLUMNS) + " |")
    lines += ["", "| summary | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report["summary"].items()]
    return "\n".join(lines) + "\n"


MARKERS = "os^vD<>ph*PXd"
LLAMA_MARKERS = {"llama_bench": "x", "llama_lookup": "+", "llama_speculative": "1", "llama_batched": "x"}


def method_style(method: str) -> dict:
    """One look a method, the same in every plot: its own colour (tab20) and marker; a llama.cpp
    row is black and dashed with a cross of its own, so the peer stands out; a `_fast` (`_fast16`)
    method is its base method dotted (dash-dotted), its markers hollow."""
    import matplotlib

    if kernels_of(method) != "exact":
        dots = {"fast": ":", "fast16": "-."}[kernels_of(method)]
        return {**method_style(base_method(method)), "linestyle": dots, "markerfacecolor": "none", "label": method}
    if method.startswith("llama"):
        return {"color": "black", "marker": LLAMA_MARKERS.get(method, "x"), "markersize": 9, "linestyle": "--",
                "linewidth": 2.0, "label": method}
    i = METHODS.index(method) if method in METHODS else len(METHODS) + sum(map(ord, method))
    return {"color": matplotlib.colormaps["tab20"](i % 20), "marker": MARKERS[i % len(MARKERS)], "label": method}


def plot_points(report: dict, temp: float) -> dict[str, list[tuple[int, float]]]:
    """{method: [(batch size, tokens/s)]}, the run's methods and then llama.cpp's rows; at batch 1
    decode tokens/s, as llama.cpp's batch-1 tools report, above it all tokens over the whole time."""
    methods = dict.fromkeys([*report["config"]["methods"], *(r["method"] for r in report["cells"])])
    out = {}
    for method in methods:
        pts = sorted((r["batch_size"], r.get("decode_tokens_per_s") or r["tokens_per_s"]) for r in report["cells"]
                     if r["method"] == method and r["temperature"] == temp and not r["skipped"])
        if pts:
            out[method] = pts
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = report["config"]["temperatures"]
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    for ax, temp in zip(axes[0], temps):
        for method, pts in plot_points(report, temp).items():
            ax.plot(*zip(*pts), **method_style(method))
        ax.set(title=f"temperature {temp}", xlabel="batch size", ylabel="tokens/s (batch 1: decode only)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(report: dict, out: Path, partial: bool = False) -> list[Path]:
    """JSON, Markdown and (final only) PNG; a partial write replaces the files atomically."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "offline.json", out / "offline.md", out / "offline.png"]
    for path, text in ((paths[0], json.dumps(report, indent=2)), (paths[1], markdown(report))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    if partial:
        return paths[:2]
    plot(report, paths[2])
    print(markdown(report))
    return paths
