"""Where a served request's CPU time goes: py-spy on every process of a running `specray serve`
(the Serve replica with the router, the target and draft worker actors, Serve's proxy and
controller) while a closed-loop load runs, summed per process and per hop.

    specray serve --no-enable-prefix-caching &   # or with --kernels fast, --colocate on, ...
    python benchmarks/served_trace.py --concurrency 1,8 --num-requests 16 --max-tokens 64 \\
        --out bench_out/served_trace.json

Needs py-spy (`pip install py-spy`; benchmarks only) and permission to attach to the processes
(root, or ptrace allowed). A hop's share is the samples whose stack passes through its code (the
first match in HOPS, in that order). Samples are meant to be of running threads, but a thread
blocked in a socket read counts as running, and sampling slows the server: `--cpu-only` skips
py-spy and reads each process's exact CPU seconds from /proc (Ray's daemons and the load
generator included). Every level sends the same prompts: serve without prefix caching, or every
level after the first measures cached prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

RATE = 200  # samples a second
PROCESSES = ("ServeReplica", "WorkerHost", "ProxyActor", "ServeController")  # `ray::<name>` titles
HOPS = (  # (hop, stack substrings): the first hop whose substring a stack holds takes the sample
    ("target forward (C kernels)", ("kernels/model.py", "kernels/cpu_ops.py", "fast_linear.py")),
    ("draft", ("kernels/drafters/",)),
    ("verification and sampling", ("kernels/verify/", "kernels/sampling.py")),
    ("target worker bookkeeping", ("actors/target_worker.py", "actors/draft_worker.py")),
    ("same-node channel", ("cluster/pools/local_channel", "multiprocessing/connection")),
    ("wire encoding", ("cluster/pools/wire", "pickle", "serialization", "msgpack")),
    ("detokenisation", ("tokenizers", "detok", "cluster/outputs.py")),
    ("router round", ("cluster/router/",)),
    ("HTTP / gRPC / SSE", ("cluster/serve/", "uvicorn", "starlette", "fastapi", "grpc", "h11", "httptools")),
    ("Ray Serve", ("ray/serve/",)),
    ("Ray core (actor calls, object store)", ("ray/_private", "ray/actor", "_raylet", "ray/_raylet")),
    ("asyncio", ("asyncio/",)),
)


def ray_processes() -> dict[int, str]:
    """pid -> `ray::<name>` of the processes worth tracing."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        m = re.match(r"ray::(\S+)", args.strip())
        if m and any(m.group(1).startswith(p) for p in PROCESSES):
            found[int(pid)] = m.group(1)
    return found


def process_cpu(pids) -> dict[int, float]:
    """pid -> CPU seconds so far (utime + stime from /proc, ended threads included): exact, unlike
    sampling."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def ray_daemons() -> dict[int, str]:
    """pid -> name of Ray's own daemons (raylet, GCS), which share the cores too."""
    out = subprocess.run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True, check=True).stdout
    return {int(pid): comm for pid, comm in (line.split(None, 1) for line in out.splitlines())
            if comm.strip() in ("raylet", "gcs_server")}


def measured_cpu(url: str, concurrency: int, args) -> dict:
    """The load without py-spy: each process's CPU seconds from /proc, and this process's (the load
    generator's), over the level."""
    procs = {**ray_processes(), **ray_daemons()}
    before, client = process_cpu(procs), time.process_time()
    tokens, seconds = load(url, concurrency, args)
    after, client = process_cpu(procs), time.process_time() - client
    per_process = {f"{name} ({pid})": round(after.get(pid, 0.0) - before.get(pid, 0.0), 2) for pid, name in procs.items()}
    per_process["load generator (this process)"] = round(client, 2)
    return {"concurrency": concurrency, "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2), "cpu_s": per_process}


def hop_of(stack: str) -> str:
    for hop, keys in HOPS:
        if any(k in stack for k in keys):
            return hop
    return "other"


def summarise(raw: Path) -> dict:
    """py-spy's raw (collapsed) output -> CPU seconds in total and per hop."""
    hops: Counter = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            hops[hop_of(stack)] += int(count)
    total = sum(hops.values())
    return {"cpu_s": round(total / RATE, 3),
            "hops": {h: round(n / RATE, 3) for h, n in hops.most_common()}}


def load(url: str, concurrency: int, args) -> tuple[int, float]:
    """The closed-loop load of `specray bench serve` (chat, streaming, greedy, `args.dataset`'s
    prompts) over HTTP, or over specray's gRPC API at `args.grpc` -> (tokens, seconds)."""
    from specray.cluster.bench.prompts import load_prompts
    from specray.cluster.bench.load import run_level, run_level_grpc

    prompts = [p["prompt"] for p in load_prompts(Path(args.dataset) if args.dataset else None, args.num_requests)]
    if len(prompts) < args.num_requests:
        print(f"only {len(prompts)} prompts in the dataset: {len(prompts)} requests a level")
    bodies = [{"model": args.model, "messages": [{"role": "user", "content": p}], "max_tokens": args.max_tokens,
               "temperature": 0.0, "stream": True, "ignore_eos": True,
               "stream_options": {"include_usage": True}} for p in prompts]
    level = (run_level_grpc(args.grpc, None, bodies, True, concurrency, None, 0) if args.grpc
             else run_level(url, {}, bodies, True, concurrency, None, 0))
    samples, seconds = asyncio.run(level)
    failed = [s for s in samples if not s.ok]
    if failed:
        print(f"{len(failed)} of {len(samples)} requests failed (not counted), e.g. {failed[0].error}")
    return sum(s.tokens for s in samples if s.ok), seconds


def trace_level(url: str, concurrency: int, args) -> dict:
    procs = ray_processes()
    if not procs:
        raise SystemExit("no `ray::ServeReplica` or worker processes: start `specray serve` first")
    with tempfile.TemporaryDirectory() as tmp:
        spies = {pid: subprocess.Popen(["py-spy", "record", "-p", str(pid), "-r", str(RATE), "-d",
                                        str(args.seconds), "-f", "raw", "--nonblocking", "-o", f"{tmp}/{pid}.txt"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in procs}
        time.sleep(1.0)  # py-spy attached
        tokens, seconds = load(url, concurrency, args)
        for spy in spies.values():
            spy.wait(timeout=args.seconds + 60)
        per_process = {}
        for pid, name in procs.items():
            raw = Path(f"{tmp}/{pid}.txt")
            per_process[f"{name} ({pid})"] = summarise(raw) if raw.exists() else None
    return {"concurrency": concurrency, "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2), "traced_s": args.seconds, "processes": per_process}


def markdown(levels: list[dict]) -> str:
    lines = []
    for lv in levels:
        if "cpu_s" in lv:
            lines += [f"concurrency {lv['concurrency']}: {lv['tokens_per_s']} tokens/s ({lv['tokens']} tokens in "
                      f"{lv['seconds']} s), CPU seconds over the level from /proc", "", "| process | CPU s |", "|---|---|"]
            lines += [f"| {name} | {cpu} |" for name, cpu in lv["cpu_s"].items()] + [""]
            continue
        lines += [f"concurrency {lv['concurrency']}: {lv['tokens_per_s']} tokens/s ({lv['tokens']} tokens in "
                  f"{lv['seconds']} s; CPU seconds over the {lv['traced_s']} s traced)", "",
                  "| process | CPU s | hops (CPU s) |", "|---|---|---|"]
        for name, s in lv["processes"].items():
            hops = "-" if s is None else ", ".join(f"{h} {v}" for h, v in s["hops"].items())
            lines.append(f"| {name} | {'-' if s is None else s['cpu_s']} | {hops} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    from specray.cluster.bench.prompts import SHARED_PROMPTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server's root")
    ap.add_argument("--model", default="smollm2-135m", help="the served model name")
    ap.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                    help="JSONL of prompts (default: Spec-Bench beside the repo, else the packaged subset)")
    ap.add_argument("--grpc", default=None, metavar="HOST:PORT",
                    help="drive specray's gRPC API at HOST:PORT instead of HTTP (e.g. 127.0.0.1:9000)")
    ap.add_argument("--concurrency", default="1,8", help="closed-loop levels, e.g. 1,8")
    ap.add_argument("--num-requests", type=int, default=16, help="requests a level")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request")
    ap.add_argument("--seconds", type=int, default=20, help="how long py-spy samples each level")
    ap.add_argument("--cpu-only", action="store_true",
                    help="no py-spy: each process's exact CPU seconds from /proc (sampling slows the server)")
    ap.add_argument("--out", default="bench_out/served_trace.json", help="the JSON results (a .md beside it)")
    args = ap.parse_args()
    # the load generator's modules (aiohttp, grpc) load here, not inside the first level's CPU window
    for module in ("specray.cluster.bench.load", *(("specray.client",) if args.grpc else ())):
        importlib.import_module(module)
    level = measured_cpu if args.cpu_only else trace_level
    levels = [level(args.url.rstrip("/"), int(c), args) for c in args.concurrency.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"levels": levels}, indent=1))
    out.with_suffix(".md").write_text(markdown(levels))
    print(markdown(levels))


if __name__ == "__main__":
    main()
