"""`specray bench serve`: a load generator for any OpenAI-compatible HTTP server.

Streams chat (or completion) requests built from the benchmark prompts, either closed-loop at a
fixed concurrency (a sweep of levels) or open-loop with Poisson arrivals at a request rate, and
reports per level: throughput, TTFT, time per output token, inter-token latency and end-to-end
latency (p50/p90/p99) and error counts, overall and per prompt category. Writes
serve.{json,md,png}; the PNG plots latency against throughput.

Open loop: a request's clock starts when it arrives, so a server (or the --concurrency cap) that
falls behind shows as latency; closed loop: when a slot frees and it is sent.

JSON schema `specray.bench.serve/3` (/2 had no inter-token latency; /1 had no per-category results,
no ignore_eos, and started the open-loop clock only once a request got a concurrency slot):
- url, grpc (HOST:PORT or null), model, endpoint ("chat" | "completions"), max_tokens,
  temperature, ignore_eos, dataset (path or null: the packaged prompts);
- `levels`: one per concurrency level: concurrency, request_rate (arrivals/s, null: closed loop),
  requests, completed, errors, error_examples (up to 3 messages), seconds (the level's wall time),
  output_tokens (completed requests' completion tokens: the server's usage, else one per streamed
  chunk), throughput_tokens_per_s, requests_per_s, ttft_s / tpot_s / e2e_s {p50, p90, p99} (seconds;
  TPOT over tokens after the first), itl_s {p50, p90, p99, max} (inter-token latency: the gaps
  between a request's consecutive streamed chunks, over every request; a stall behind another
  request's prefill shows here, not in TPOT's per-request mean), per_category {category:
  {requests, completed, errors, output_tokens, ttft_p50_s, e2e_p50_s}}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from specray.cluster.args import non_negative_float, out_folder, positive_float, positive_int, positive_int_list
from specray.cluster.bench.listing import first_grpc_model, first_model
from specray.cluster.bench.load import Sample, run_level, run_level_grpc
from specray.cluster.bench.prompts import dataset_name, load_prompts

SCHEMA = "specray.bench.serve/3"


def percentiles(values: list[float]) -> dict:
    """p50 / p90 / p99, interpolated between the ranks around them (numpy's default, as vLLM's
    benchmark reports them): the p50 of two values is their mean, not the larger."""
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    v = sorted(values)

    def pick(q: float) -> float:
        at = q * (len(v) - 1)
        lo = int(at)
        hi = min(lo + 1, len(v) - 1)
        return round(v[lo] + (v[hi] - v[lo]) * (at - lo), 4)

    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


def inter_token(samples: list[Sample]) -> dict:
    """Percentiles and the largest of the gaps between consecutive chunks, over every request."""
    gaps = [g for s in samples for g in s.gaps]
    return {**percentiles(gaps), "max": round(max(gaps), 4) if gaps else None}


def per_category(samples: list[Sample], categories: list[str]) -> dict:
    groups: dict[str, list[Sample]] = {}
    for sample, category in zip(samples, categories, strict=True):
        groups.setdefault(category, []).append(sample)
    out = {}
    for category, group in sorted(groups.items()):
        ok = [s for s in group if s.ok]
        out[category] = {"requests": len(group), "completed": len(ok), "errors": len(group) - len(ok),
                         "output_tokens": sum(s.tokens for s in ok),
                         "ttft_p50_s": percentiles([s.first - s.start for s in ok if s.first])["p50"],
                         "e2e_p50_s": percentiles([s.end - s.start for s in ok])["p50"]}
    return out


def summarise(concurrency: int, rate: float | None, samples: list[Sample], seconds: float,
              categories: list[str] | None = None) -> dict:
    ok = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    return {
        "concurrency": concurrency, "request_rate": rate, "requests": len(samples), "completed": len(ok),
        "errors": len(samples) - len(ok), "error_examples": sorted({s.error for s in samples if s.error})[:3],
        "seconds": round(seconds, 4), "output_tokens": tokens,
        "throughput_tokens_per_s": round(tokens / seconds, 3) if seconds else 0.0,
        "requests_per_s": round(len(ok) / seconds, 3) if seconds else 0.0,
        "ttft_s": percentiles([s.first - s.start for s in ok if s.first]),
        "tpot_s": percentiles([(s.end - s.first) / (s.tokens - 1) for s in ok if s.first and s.tokens > 1]),
        "itl_s": inter_token(ok),
        "e2e_s": percentiles([s.end - s.start for s in ok]),
        "per_category": per_category(samples, categories or ["all"] * len(samples)),
    }


def request_bodies(args, model: str) -> list[dict]:
    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_requests)
    bodies = []
    for i in range(args.num_requests):
        p, category = prompts[i % len(prompts)]["prompt"], prompts[i % len(prompts)]["category"]
        common = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True,
                  "stream_options": {"include_usage": True}, "seed": i, "category": category}
        if args.ignore_eos:  # vLLM's extension: every request runs to max_tokens
            common["ignore_eos"] = True
        bodies.append({**common, "messages": [{"role": "user", "content": p}]} if args.endpoint == "chat"
                      else {**common, "prompt": p})
    return bodies


def markdown(report: dict) -> str:
    where = report["url"] or f"gRPC {report['grpc']}"
    lines = [f"{where} model {report['model']}, {report['endpoint']}, {report['max_tokens']} max tokens; "
             f"prompts: {dataset_name(report.get('dataset'))}", "",
             "| concurrency | rate | completed | errors | tokens/s | req/s | TTFT p50/p99 s | TPOT p50/p99 s | "
             "ITL p50/p99/max s | E2E p50/p90/p99 s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["levels"]:
        t, p, i, e = r["ttft_s"], r["tpot_s"], r["itl_s"], r["e2e_s"]
        lines.append(f"| {r['concurrency']} | {r['request_rate'] or 'closed loop'} | {r['completed']} | {r['errors']} | "
                     f"{r['throughput_tokens_per_s']} | {r['requests_per_s']} | {t['p50']}/{t['p99']} | "
                     f"{p['p50']}/{p['p99']} | {i['p50']}/{i['p99']}/{i['max']} | {e['p50']}/{e['p90']}/{e['p99']} |")
    lines += ["", "| concurrency | category | completed | errors | output tokens | TTFT p50 s | E2E p50 s |",
              "|---|---|---|---|---|---|---|"]
    for r in report["levels"]:
        for cat, c in r["per_category"].items():
            lines.append(f"| {r['concurrency']} | {cat} | {c['completed']} | {c['errors']} | {c['output_tokens']} | "
                         f"{c['ttft_p50_s']} | {c['e2e_p50_s']} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r["throughput_tokens_per_s"], r["e2e_s"]["p50"], r["concurrency"]) for r in report["levels"]
           if r["e2e_s"]["p50"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        for x, y, c in pts:
            ax.annotate(f"c={c}", (x, y), fontsize=8)
    ax.set(xlabel="throughput (output tokens/s)", ylabel="p50 end-to-end latency (s)", title="latency vs throughput")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd_bench_serve(args) -> int:
    import httpx

    if args.quick:
        args.num_requests, args.max_tokens = min(args.num_requests, 8), min(args.max_tokens, 32)
    if args.against_llama_server:
        from specray.cluster.bench.side_by_side import run_side_by_side

        return run_side_by_side(args)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.model:
        model = args.model
    elif args.grpc:
        model = first_grpc_model(args.grpc, args.api_key)
    else:
        model = first_model(httpx, args.url, headers)
    from tqdm import tqdm

    bodies = request_bodies(args, model)
    categories = [b["category"] for b in bodies]
    levels = []
    chat = args.endpoint == "chat"
    for c in args.concurrency:
        with tqdm(total=len(bodies), desc=f"bench serve (concurrency {c})", mininterval=1) as bar:
            if args.grpc:
                level = run_level_grpc(args.grpc, args.api_key, bodies, chat, c, args.request_rate, c, bar)
            else:
                level = run_level(args.url, headers, bodies, chat, c, args.request_rate, c, bar)
            samples, seconds = asyncio.run(level)
        levels.append(summarise(c, args.request_rate, samples, seconds, categories))
        print(f"concurrency {c}: {levels[-1]['throughput_tokens_per_s']} tokens/s, {levels[-1]['errors']} errors")
    report = {"schema": SCHEMA, "url": None if args.grpc else args.url, "grpc": args.grpc, "model": model,
              "endpoint": args.endpoint, "max_tokens": args.max_tokens, "temperature": args.temperature,
              "ignore_eos": args.ignore_eos, "dataset": args.dataset, "levels": levels}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(report, indent=2))
    (out / "serve.md").write_text(markdown(report))
    plot(report, out / "serve.png")
    print(markdown(report))
    return failed(levels)


def failed(levels: list[dict]) -> int:
    """1 where a request failed, saying how many and why (the first errors): a level's figures then
    count its completed requests only, over a wall time its failures shortened, so they are no
    measurement of the server (the report is written all the same)."""
    errors, total = sum(level["errors"] for level in levels), sum(level["requests"] for level in levels)
    if not errors:
        return 0
    examples = sorted({e for level in levels for e in level["error_examples"]})[:3]
    what = "every request failed" if errors == total else f"{errors} of {total} requests failed"
    print(f"specray bench serve: error: {what}, e.g. {examples}", file=sys.stderr)
    return 1


def add_serve_bench_parser(kinds) -> None:
    from specray.cluster.bench.prompts import SHARED_PROMPTS

    srv = kinds.add_parser("serve", help="load-test any OpenAI-compatible HTTP server")
    srv.add_argument("--url", default="http://127.0.0.1:8000", help="the server's root, with or without /v1")
    srv.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    srv.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    srv.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                     help="/v1/chat/completions (the prompt as a user message) or /v1/completions")
    srv.add_argument("--concurrency", type=positive_int_list, default=[1, 8, 16],
                     help="closed-loop levels, e.g. 1,8,16; with --request-rate, the most requests in flight, "
                          "one open-loop pass a level (as vLLM's --max-concurrency)")
    srv.add_argument("--request-rate", type=positive_float, default=None,
                     help="Poisson arrivals per second (open loop), capped by each --concurrency level")
    srv.add_argument("--num-requests", type=positive_int, default=32, help="requests a level")
    srv.add_argument("--max-tokens", type=positive_int, default=128, help="max_tokens of every request")
    srv.add_argument("--temperature", type=non_negative_float, default=0.0, help="of every request (each has its own seed)")
    srv.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                     help="JSONL of prompts (default: Spec-Bench beside the checkout if present, else the "
                          "packaged subset)")
    srv.add_argument("--ignore-eos", action="store_true",
                     help="ask every request to run to max_tokens (vLLM's extension; specray honours it)")
    srv.add_argument("--quick", action="store_true", help="8 requests, 32 tokens")
    srv.add_argument("--grpc", default=None, metavar="HOST:PORT",
                     help="drive specray's gRPC API at HOST:PORT instead of HTTP (same prompts and report)")
    srv.add_argument("--against-llama-server", action="store_true",
                     help="start llama-server and `specray serve` on the same GGUF (--model, default smollm2-135m) "
                          "and measure both, level by level, in one run (--url is not used)")
    srv.add_argument("--llama-cpp", default=None, metavar="DIR",
                     help="a llama.cpp build's bin folder (default: the newest from scripts/build_llama_cpp.sh)")
    srv.add_argument("--llama-parallel", type=positive_int, default=16, help="llama-server's slots (-np)")
    srv.add_argument("--llama-ctx", type=positive_int, default=None,
                     help="llama-server's context, shared by its slots (-c; default 2048 a slot)")
    srv.add_argument("--threads", type=positive_int, default=None, help="llama-server's threads (default: this node's cores)")
    srv.add_argument("--specray-args", default="", help="extra `specray serve` flags, e.g. \"--colocate off\" "
                     "(a lone flag with =: --specray-args=--flag)")
    srv.add_argument("--llama-args", default="", help="extra llama-server flags, e.g. its own speculation: "
                     "\"--spec-type ngram-map-k\" (a lone flag with =: --llama-args=--flag)")
    srv.add_argument("--out", type=out_folder, default="bench_out", help="folder for the report (JSON, Markdown, plot)")
    srv.set_defaults(func=cmd_bench_serve)
