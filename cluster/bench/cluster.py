"""`specray bench cluster`: the served path against the in-process engine, in one run.

1. In-process engine, closed loop at each concurrency (a new request starts when one finishes),
   then the Ray actor pools driven the same way from this process; both split a round's time
   (target, draft, router; for actors, how much of each wait their worker computed).
2. `specray serve`'s stack on a local Ray cluster, the same closed loop over HTTP with streaming
   (and gRPC): as the flags configure it, with separate actor pools, and with separate pools and two
   groups in flight, and with separate pools on Ray actor calls instead of same-node channels (a
   configuration equal to one already measured in the pass is not run again). Each of their levels
   runs right after an in-process run of the same level (the report's `vs paired` ratio).
   With --repeats the passes alternate that many times and the median pass is reported; --paths
   runs only the named paths beside the in-process engine (an A/B of two served configurations).
3. Each draft transport (ray, torch_distributed, grpc): bytes and latency per propose round,
   read from the router's side of the link while the engine runs the same prompts.
Writes cluster.json and cluster.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from specray.cluster.args import out_folder, positive_int, positive_int_list
from specray.cluster.bench.cluster_report import markdown, median_rows
from specray.cluster.bench.prompts import load_prompts
from specray.cluster.bench.load import run_level, run_level_grpc
from specray.cluster.bench.serve import percentiles, summarise
from specray.cluster.router.round_stats import breakdown, snapshot
from specray.kernels.chat import prompt_token_ids

SCHEMA = "specray.bench.cluster/1"



def closed_loop(router, requests: list[list[int]], params, concurrency: int) -> dict:
    """Keep `concurrency` requests in flight on an Router; latency from each request's start."""
    pending, started, e2e, tokens, first, tpot = list(requests), {}, [], 0, {}, []
    start = time.perf_counter()
    while pending or router.has_unfinished():
        while pending and len(started) < concurrency:
            rid = router.add_request(pending.pop(0), params)
            started[rid] = time.perf_counter()
        for out in router.step():
            now, n = time.perf_counter(), len(out.outputs[0].token_ids)
            if n and out.request_id not in first:
                first[out.request_id] = now
            if out.finished:
                e2e.append(now - started.pop(out.request_id))
                if n > 1:
                    tpot.append((now - first.pop(out.request_id)) / (n - 1))
                tokens += n
    seconds = time.perf_counter() - start
    return {"concurrency": concurrency, "completed": len(e2e), "output_tokens": tokens, "seconds": round(seconds, 3),
            "throughput_tokens_per_s": round(tokens / seconds, 3), "e2e_s": percentiles(e2e),
            "tpot_s": percentiles(tpot)}


def measured_loop(router, requests, params, concurrency: int) -> dict:
    """closed_loop plus where a round's time went (cluster/router/round_stats.py)."""
    before = snapshot(router)
    row = closed_loop(router, requests, params, concurrency)
    row["round_ms"] = breakdown(before, snapshot(router))
    return row


class InProcess:
    """The in-process engine at each level, kept for the whole pass: every other path's level is
    paired with an in-process run of the same level just before it (`paired`), two runs seconds apart
    instead of minutes (this shared box drifts by a quarter between passes), the serving stack up and
    idle during the in-process one; the report keeps the ratio to the pass's first runs too."""

    def __init__(self, cfg, requests, params, levels):
        from specray import LLM

        self.requests, self.params, self.engines = requests, params, {}
        for c in levels:
            llm = LLM(cfg.model, speculative_config=cfg.speculative_config, max_num_seqs=c,
                      kv_cache_tokens=cfg.router.kv_cache_tokens, pipelined=False, kernels=cfg.pools.target.kernels,
                      enable_prefix_caching=cfg.router.enable_prefix_caching)
            closed_loop(llm.router, requests[:2], params, 2)  # warm-up, as the served path gets
            self.engines[c] = llm

    def level(self, c: int) -> dict:
        return measured_loop(self.engines[c].router, self.requests, self.params, c)

    def rows(self) -> list[dict]:
        rows = []
        for c in self.engines:
            rows.append(self.level(c))
            print(f"in-process c={c}: {rows[-1]['throughput_tokens_per_s']} tokens/s", flush=True)
        return rows

    def paired(self, c: int) -> float:
        return self.level(c)["throughput_tokens_per_s"]


def ray_pools(cfg, requests, params, levels, engine: InProcess) -> list[dict]:
    """The Ray pools `specray serve` starts, one group in flight, driven from this process: the
    actor hops without Serve, HTTP or the replica's threads."""
    from specray.cluster.serve.runtime import build_runtime

    rows = []
    for c in levels:
        runtime = build_runtime(cfg.with_overrides(**{"router.max_num_seqs": c, "router.pipelined": False,
                                                      "pools.colocate": False}))
        runtime.async_router.shutdown()  # this thread drives the router
        closed_loop(runtime.router, requests[:2], params, 2)
        paired = engine.paired(c)
        rows.append({**measured_loop(runtime.router, requests, params, c), "in_process_paired": paired})
        runtime.shutdown()
        print(f"ray pools c={c}: {rows[-1]['throughput_tokens_per_s']} tokens/s", flush=True)
    return rows


def served(cfg, bodies, levels, label, engine: InProcess, grpc: bool = False) -> tuple[list[dict], list[dict]]:
    """HTTP levels (and, with `grpc`, the same levels through the gRPC API) on one deployment, each
    after an in-process run of its level on `engine`."""
    from ray import serve

    from specray.cluster.serve.run import run_serve

    started = run_serve(cfg)
    handle = serve.get_app_handle("specray")
    url, target = f"http://127.0.0.1:{cfg.http.port}", f"127.0.0.1:{cfg.grpc.port}"
    asyncio.run(run_level(url, {}, bodies[:2], True, 2, None, 0))  # warm-up
    protocols = [("HTTP", lambda c: run_level(url, {}, bodies, True, c, None, seed=c))]
    if grpc and started["grpc"]:
        protocols.append(("gRPC", lambda c: run_level_grpc(target, None, bodies, True, c, None, seed=c)))
    out: dict[str, list[dict]] = {"HTTP": [], "gRPC": []}
    for name, level in protocols:
        for c in levels:
            paired = engine.paired(c)
            before = handle.round_stats.remote().result()
            samples, seconds = asyncio.run(level(c))
            out[name].append(summarise(c, None, samples, seconds))
            row = out[name][-1]
            row["round_ms"] = breakdown(before, handle.round_stats.remote().result())
            row["in_process_paired"] = paired
            print(f"{label} {name} c={c}: {row['throughput_tokens_per_s']} tokens/s, {row['errors']} errors",
                  flush=True)
    serve.delete("specray")
    return out["HTTP"], out["gRPC"]


def transports(cfg, requests, params, concurrency: int) -> list[dict]:
    """Bytes and latency per propose round for each draft transport, same prompts."""
    from specray.cluster.config.worker_specs import num_blocks, serve_target_spec
    from specray.cluster.pools.build import build_draft_pool, placement
    from specray.cluster.pools.ray_pools import RayTargetPool
    from specray.cluster.router.limits import router_limits
    from specray.cluster.router.router import Router
    from specray.cluster.serve.drafter_cli import drafter_argv
    from specray.cluster.serve.http_server import free_port
    from specray.kernels.config import ModelConfig
    from specray.kernels.loader import resolve

    checkpoint = resolve(cfg.model)
    tok = checkpoint.tokenizer()
    target = RayTargetPool(serve_target_spec(cfg), placement(cfg.pools.target))  # one worker: no TP
    rows = []
    for kind in ("ray", "torch_distributed", "grpc", "inline"):  # inline: no bytes travel
        drafter, overrides = None, {"transport.kind": kind}
        if kind == "grpc":
            port = free_port()
            drafter = subprocess.Popen([sys.executable, "-m", "specray.cluster.cli", "drafter", "--host", "127.0.0.1",
                                        "--port", str(port), *drafter_argv(cfg.speculative, cfg.model)],
                                       stdout=subprocess.DEVNULL)  # the same drafts as the other rows
            overrides["transport.drafter_address"] = f"127.0.0.1:{port}"
        kcfg = cfg.with_overrides(**overrides)
        pool = build_draft_pool(kcfg)
        pool.ready()
        limits, eos = router_limits(ModelConfig.from_hf(checkpoint.hf_config()), tok, kcfg.speculative, None,
                                     concurrency, num_blocks(kcfg.router.kv_cache_tokens, kcfg.router.block_size),
                                    kcfg.router.block_size, pipelined=False)
        result = closed_loop(Router(target, pool, tok, eos, limits), requests, params, concurrency)
        s = pool.stats
        rows.append({"transport": kind, "rounds": s.rounds, "bytes_sent_per_round": round(s.bytes_sent / s.rounds, 1),
                     "bytes_received_per_round": round(s.bytes_received / s.rounds, 1),
                     "round_trip_ms": round(1000 * s.seconds / s.rounds, 3),
                     "throughput_tokens_per_s": result["throughput_tokens_per_s"]})
        print(f"transport {kind}: {rows[-1]}", flush=True)
        if hasattr(pool, "close"):
            pool.close()
        if drafter is not None:
            drafter.terminate()
    target.close()
    return rows


SERVED = (  # label, overrides, with gRPC as well
    ("served", {}, True),  # as the flags configure `specray serve`
    ("served_pools", {"pools.colocate": False, "router.pipelined": False}, True),
    ("served_pipelined", {"pools.colocate": False, "router.pipelined": True}, False),
    ("served_ray_calls", {"pools.colocate": False, "router.pipelined": False, "pools.channel": "ray"}, False),
)


PATHS = ("ray_pools", *(name for name, _, _ in SERVED))  # --paths picks among these; in_process always runs


def one_pass(cfg, requests, params, bodies, levels, paths=PATHS) -> dict:
    """In-process, the Ray pools driven from here, then each served configuration over HTTP (and gRPC),
    every level of those paired with an in-process run of it just before."""
    engine = InProcess(cfg, requests, params, levels)
    out = {"in_process": engine.rows()}
    if "ray_pools" in paths:
        out["ray_pools"] = ray_pools(cfg, requests, params, levels, engine)
    measured: list[tuple] = []  # (config, HTTP rows, gRPC rows) of this pass
    for name, overrides, grpc in (s for s in SERVED if s[0] in paths):
        run_cfg = cfg.with_overrides(**{"router.pipelined": cfg.pipelined, **overrides})  # auto resolved
        same = next((rows for c, *rows in measured if c == run_cfg), None)
        http_rows, grpc_rows = same or served(run_cfg, bodies, levels, name.replace("_", " "), engine, grpc=grpc)
        measured.append((run_cfg, http_rows, grpc_rows))
        out[name] = http_rows
        if grpc:
            out[f"{name}_grpc"] = grpc_rows
    return out


def cmd_bench_cluster(args) -> int:
    from specray.cluster.params import SamplingParams
    from specray.cluster.serve.cli import resolve_config
    from specray.cluster.serve.local_ray import start_ray
    from specray.kernels.loader import resolve

    cfg = bench_config(resolve_config(args), args.enable_prefix_caching)
    prompts = [p["prompt"] for p in load_prompts(Path(args.dataset) if args.dataset else None, args.num_requests)]
    prompts = (prompts * (1 + args.num_requests // max(1, len(prompts))))[:args.num_requests]
    tok = resolve(cfg.model).tokenizer()
    requests = [prompt_token_ids(tok, p) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    bodies = [{"model": cfg.model_name, "messages": [{"role": "user", "content": p}], "max_tokens": args.max_tokens,
               "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}} for p in prompts]
    report = {"schema": SCHEMA, "model": cfg.model, "speculative_config": cfg.speculative_config,
              "enable_prefix_caching": cfg.router.enable_prefix_caching,
              "max_tokens": args.max_tokens, "num_requests": args.num_requests, "repeats": args.repeats}
    start_ray(cfg)
    passes = [one_pass(cfg, requests, params, bodies, args.concurrency, args.paths) for _ in range(args.repeats)]
    report.update(median_rows(passes))
    if args.repeats > 1:
        report["passes"] = passes
    write_report(report, Path(args.out))  # the rows measured so far stay whatever the next phase does
    if cfg.speculative_config and not args.skip_transports:
        try:
            report["transports"] = transports(cfg, requests[:8], params, min(8, max(args.concurrency)))
        except (RuntimeError, ValueError) as e:  # e.g. no node offers the draft pool's resources
            print(markdown(report))
            print(f"specray bench cluster: the transports phase failed ({e}); the rows above are in {args.out} "
                  "(--skip-transports leaves the phase out)", file=sys.stderr)
            return 1
        write_report(report, Path(args.out))
    print(markdown(report))
    return 0


def bench_config(cfg, prefix_caching: bool | None):
    """Every path's config: the flags' on loopback, prefix caching off unless asked for (the levels
    repeat the prompts, which a cache would answer from the second level on)."""
    return cfg.with_overrides(**{"http.host": "127.0.0.1", "router.enable_prefix_caching": bool(prefix_caching)})


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster.json").write_text(json.dumps(report, indent=2))
    (out / "cluster.md").write_text(markdown(report))


def paths_list(text: str) -> tuple[str, ...]:
    paths = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in paths if x not in PATHS]
    if unknown or not paths:
        raise argparse.ArgumentTypeError(f"unknown path(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {', '.join(PATHS)}")
    return paths


def add_cluster_bench_parser(kinds) -> None:
    from specray.cluster.serve.cli import add_serve_flags

    p = kinds.add_parser("cluster", help="served (Ray Serve + pools) vs in-process, and the draft transports",
                         description="Takes every `specray serve` flag; runs both router modes itself. The levels "
                                     "repeat the prompts: prefix caching is off on every path unless asked for.")
    add_serve_flags(p)
    p.add_argument("--concurrency", type=positive_int_list, default=[1, 8, 16], help="closed-loop levels, e.g. 1,8,16")
    p.add_argument("--num-requests", type=positive_int, default=16, help="requests a level")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="new tokens a request (greedy)")
    p.add_argument("--dataset", default=None, help="JSONL of prompts (default: the packaged Spec-Bench subset)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="run every path this many times, interleaved, and report each one's median pass")
    p.add_argument("--paths", type=paths_list, default=PATHS,
                   help=f"which paths to run beside the in-process engine, comma-separated: {','.join(PATHS)} "
                   "(default: all; served_pools etc. also measure gRPC where the table has a _grpc row)")
    p.add_argument("--skip-transports", action="store_true", help="leave out the draft transports' table")
    p.add_argument("--out", type=out_folder, default="bench_out", help="folder for cluster.{json,md}")
    p.set_defaults(func=cmd_bench_cluster)
