"""`specray bench serve`: a load generator for any OpenAI-compatible HTTP server.

Streams chat (or completion) requests built from the benchmark prompts, either closed-loop at a
fixed concurrency (a sweep of levels) or open-loop with Poisson arrivals at a request rate, and
reports per level: throughput, TTFT, time per output token and end-to-end latency (p50/p90/p99)
and error counts. Writes serve.{json,md,png}; the PNG plots latency against throughput.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from specray.cluster.bench_prompts import load_prompts

SCHEMA = "specray.bench.serve/1"


@dataclass
class Sample:
    ok: bool
    start: float
    first: float | None = None
    end: float = 0.0
    tokens: int = 0
    error: str | None = None


async def one_request(client, url: str, body: dict, chat: bool) -> Sample:
    s = Sample(ok=False, start=time.perf_counter())
    chunks = 0
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                s.error = f"HTTP {resp.status_code}"
                await resp.aread()
                return s
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    s.error = chunk["error"].get("message", "error in stream")
                    return s
                if chunk.get("usage"):
                    s.tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if text:
                        chunks += 1
                        s.first = s.first or time.perf_counter()
        s.ok = True
    except Exception as e:  # a refused connection or a timeout counts as an error, not a crash
        s.error = f"{type(e).__name__}: {e}"
    finally:
        s.end = time.perf_counter()
        s.tokens = s.tokens or chunks  # servers without stream usage: one chunk ~ one token
    return s


async def run_level(base: str, headers: dict, bodies: list[dict], chat: bool, concurrency: int,
                    rate: float | None, seed: int) -> tuple[list[Sample], float]:
    import httpx

    url = base.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    gate, rng = asyncio.Semaphore(concurrency), random.Random(seed)
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(600.0)) as client:
        async def guarded(body):
            async with gate:
                return await one_request(client, url, body, chat)

        start, tasks = time.perf_counter(), []
        for body in bodies:
            tasks.append(asyncio.create_task(guarded(body)))
            if rate:  # open loop: exponential gaps between arrivals
                await asyncio.sleep(rng.expovariate(rate))
        samples = await asyncio.gather(*tasks)
    return samples, time.perf_counter() - start


async def one_grpc_request(client, body: dict, chat: bool) -> Sample:
    """The same request through specray's gRPC API (`specray.client.AsyncClient.stream`)."""
    from specray.client import Sampling, SpecrayError

    s = Sample(ok=False, start=time.perf_counter())
    sampling = Sampling(max_tokens=body["max_tokens"], temperature=body["temperature"], seed=body.get("seed"))
    prompt = None if chat else body["prompt"]
    try:
        stream = client.stream(prompt, messages=body.get("messages") if chat else None, sampling=sampling,
                               model=body.get("model"))
        async for delta in stream:
            if delta.token_ids:
                s.first = s.first or time.perf_counter()
                s.tokens += len(delta.token_ids)
        s.end, s.ok = time.perf_counter(), True
    except SpecrayError as e:
        s.error = f"gRPC {e.code.name}: {e.details}"
    return s


async def run_level_grpc(target: str, api_key: str | None, bodies: list[dict], chat: bool, concurrency: int,
                         rate: float | None, seed: int) -> tuple[list[Sample], float]:
    from specray.client import AsyncClient

    gate, rng = asyncio.Semaphore(concurrency), random.Random(seed)
    async with AsyncClient(target, api_key=api_key, timeout=600) as client:
        async def guarded(body):
            async with gate:
                return await one_grpc_request(client, body, chat)

        start, tasks = time.perf_counter(), []
        for body in bodies:
            tasks.append(asyncio.create_task(guarded(body)))
            if rate:
                await asyncio.sleep(rng.expovariate(rate))
        samples = await asyncio.gather(*tasks)
    return samples, time.perf_counter() - start


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    v = sorted(values)
    pick = lambda q: round(v[min(len(v) - 1, int(q * len(v)))], 4)  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


def summarise(concurrency: int, rate: float | None, samples: list[Sample], seconds: float) -> dict:
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
        "e2e_s": percentiles([s.end - s.start for s in ok]),
    }


def request_bodies(args, model: str) -> list[dict]:
    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_requests)
    bodies = []
    for i in range(args.num_requests):
        p = prompts[i % len(prompts)]["prompt"]
        common = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True,
                  "stream_options": {"include_usage": True}, "seed": i}
        bodies.append({**common, "messages": [{"role": "user", "content": p}]} if args.endpoint == "chat"
                      else {**common, "prompt": p})
    return bodies


def markdown(report: dict) -> str:
    lines = [f"{report['url']} model {report['model']}, {report['endpoint']}, {report['max_tokens']} max tokens", "",
             "| concurrency | rate | completed | errors | tokens/s | req/s | TTFT p50/p99 s | TPOT p50/p99 s | E2E p50/p90/p99 s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["levels"]:
        t, p, e = r["ttft_s"], r["tpot_s"], r["e2e_s"]
        lines.append(f"| {r['concurrency']} | {r['request_rate'] or 'closed loop'} | {r['completed']} | {r['errors']} | "
                     f"{r['throughput_tokens_per_s']} | {r['requests_per_s']} | {t['p50']}/{t['p99']} | "
                     f"{p['p50']}/{p['p99']} | {e['p50']}/{e['p90']}/{e['p99']} |")
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

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        model = args.model or httpx.get(args.url.rstrip("/") + "/v1/models", headers=headers,
                                        timeout=30).json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ValueError(f"cannot list models at {args.url}: {e}") from None
    if args.quick:
        args.num_requests, args.max_tokens = min(args.num_requests, 8), min(args.max_tokens, 32)
    bodies = request_bodies(args, model)
    levels = []
    chat = args.endpoint == "chat"
    for c in args.concurrency:
        if args.grpc:
            level = run_level_grpc(args.grpc, args.api_key, bodies, chat, c, args.request_rate, seed=c)
        else:
            level = run_level(args.url, headers, bodies, chat, c, args.request_rate, seed=c)
        samples, seconds = asyncio.run(level)
        levels.append(summarise(c, args.request_rate, samples, seconds))
        print(f"concurrency {c}: {levels[-1]['throughput_tokens_per_s']} tokens/s, {levels[-1]['errors']} errors")
    report = {"schema": SCHEMA, "url": args.url, "grpc": args.grpc, "model": model, "endpoint": args.endpoint,
              "max_tokens": args.max_tokens, "temperature": args.temperature, "levels": levels}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(report, indent=2))
    (out / "serve.md").write_text(markdown(report))
    plot(report, out / "serve.png")
    print(markdown(report))
    return 0


def add_serve_bench_parser(kinds) -> None:
    from specray.cluster.bench_offline import int_list

    srv = kinds.add_parser("serve", help="load-test any OpenAI-compatible HTTP server")
    srv.add_argument("--url", default="http://127.0.0.1:8000")
    srv.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    srv.add_argument("--api-key", default=None)
    srv.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    srv.add_argument("--concurrency", type=int_list, default=[1, 8, 16], help="closed-loop levels, e.g. 1,8,16")
    srv.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second (open loop)")
    srv.add_argument("--num-requests", type=int, default=32)
    srv.add_argument("--max-tokens", type=int, default=128)
    srv.add_argument("--temperature", type=float, default=0.0)
    srv.add_argument("--dataset", default=None, help="JSONL of prompts (default: the packaged Spec-Bench subset)")
    srv.add_argument("--quick", action="store_true", help="8 requests, 32 tokens")
    srv.add_argument("--grpc", default=None, metavar="HOST:PORT",
                     help="drive specray's gRPC API at HOST:PORT instead of HTTP (same prompts and report)")
    srv.add_argument("--out", default="bench_out")
    srv.set_defaults(func=cmd_bench_serve)
