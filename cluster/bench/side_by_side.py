"""`specray bench serve --against-llama-server`: llama-server and `specray serve` on the same GGUF,
with the same prompts and client, levels interleaved (which server goes first alternates), in one run.
Benchmarks only: llama.cpp comes from `scripts/build_llama_cpp.sh` or --llama-cpp."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from specray.cluster.bench.listing import first_model
from specray.cluster.bench.load import run_level
from specray.cluster.bench.prompts import dataset_name
from specray.cluster.bench.serve import request_bodies, summarise

SCHEMA = "specray.bench.side_by_side/1"
SERVERS = ("llama-server", "specray")


def find_llama_server(given: str | None) -> Path:
    """--llama-cpp (a build's bin folder or the binary), else the newest build in specray's cache."""
    from specray.cluster.bench.llama_cpp import find_llama_binary, llama_cache

    binary = find_llama_binary("llama-server", given)
    if binary is None:
        raise ValueError(f"no llama-server in {llama_cache()}: build one with `bash scripts/build_llama_cpp.sh` "
                         "(benchmarks only) or pass --llama-cpp DIR")
    return binary


def gguf_of(model: str) -> Path:
    """The GGUF file both servers load: an alias's packaged file, or a .gguf path."""
    from specray.kernels.loader import ALIASES, _packaged_file

    if model in ALIASES:
        return _packaged_file(*ALIASES[model])
    path = Path(model).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise ValueError(f"--against-llama-server needs a GGUF model (an alias such as smollm2-135m or a .gguf "
                         f"file), got {model!r}")
    return path


def llama_server_command(binary: Path, gguf: Path, port: int, threads: int, parallel: int, ctx: int,
                         extra: str = "") -> list[str]:
    """llama-server on the GGUF, then the extra flags (e.g. its own speculation: "--spec-type ngram-map-k")."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-np", str(parallel), "-c", str(ctx), *shlex.split(extra)]


def specray_command(model: str, port: int, grpc_port: int, extra: str) -> list[str]:
    """`specray serve` with the extra flags; prefix caching off unless they say (the levels repeat the
    prompts, and llama-server's requests carry cache_prompt false for the same reason)."""
    flags = shlex.split(extra)
    caching = [] if any(f.endswith("enable-prefix-caching") for f in flags) else ["--no-enable-prefix-caching"]
    return [sys.executable, "-m", "specray.cluster.cli", "serve", "--model", model, "--port", str(port),
            "--grpc-port", str(grpc_port), *caching, *flags]


class Server:
    """A server process, up once its /health answers 200 and its /v1/models lists a model (a port
    picked free can be taken by another process before the server binds it: another answer there
    must not pass for the server's); stopped on exit. Output goes to `log`."""

    def __init__(self, name: str, command: list[str], url: str, log: Path, timeout_s: float = 600):
        self.name, self.command, self.url, self.log, self.timeout_s = name, command, url, log, timeout_s

    def __enter__(self) -> "Server":
        import httpx

        self.proc = subprocess.Popen(self.command, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    first_model(httpx, self.url, {})
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        self.__exit__()
        raise RuntimeError(f"{self.name} did not become healthy within {self.timeout_s:.0f}s; see {self.log}")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()  # SIGTERM: `specray serve` shuts its Ray cluster down
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def compare(levels: dict[str, list[dict]]) -> list[dict]:
    """Per concurrency: specray over llama-server (tokens/s), both TTFT / TPOT p50 and ITL p99."""
    rows = []
    for ll, sp in zip(levels["llama-server"], levels["specray"], strict=True):
        base = ll["throughput_tokens_per_s"]
        rows.append({"concurrency": ll["concurrency"], "llama_tokens_per_s": base,
                     "specray_tokens_per_s": sp["throughput_tokens_per_s"],
                     "ratio": round(sp["throughput_tokens_per_s"] / base, 3) if base else None,
                     "ttft_p50_s": [ll["ttft_s"]["p50"], sp["ttft_s"]["p50"]],
                     "tpot_p50_s": [ll["tpot_s"]["p50"], sp["tpot_s"]["p50"]],
                     "itl_p99_s": [ll["itl_s"]["p99"], sp["itl_s"]["p99"]],
                     "errors": [ll["errors"], sp["errors"]]})
    return rows


def markdown(report: dict) -> str:
    lines = [f"{report['model']} ({report['gguf']}), {report['endpoint']}, {report['num_requests']} requests x "
             f"{report['max_tokens']} tokens a level, temperature {report['temperature']}, ignore_eos "
             f"{report['ignore_eos']}, prompts: {dataset_name(report.get('dataset'))}; llama-server (cache_prompt "
             f"false): `{' '.join(report['llama_command'][1:])}`; "
             "specray serve (prefix caching off unless its flags say): "
             f"`{report['specray_args'] or '(defaults)'}`", "",
             "| concurrency | llama-server tokens/s | specray serve tokens/s | ratio | TTFT p50 s (llama / specray) "
             "| TPOT p50 s (llama / specray) | ITL p99 s (llama / specray) | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["comparison"]:
        lines.append(f"| {r['concurrency']} | {r['llama_tokens_per_s']} | {r['specray_tokens_per_s']} | "
                     f"{r['ratio']}x | {r['ttft_p50_s'][0]} / {r['ttft_p50_s'][1]} | {r['tpot_p50_s'][0]} / "
                     f"{r['tpot_p50_s'][1]} | {r['itl_p99_s'][0]} / {r['itl_p99_s'][1]} | "
                     f"{r['errors'][0]} / {r['errors'][1]} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, style in zip(SERVERS, (dict(color="tab:gray", marker="s"), dict(color="tab:blue", marker="o"))):
        pts = [(r["throughput_tokens_per_s"], r["e2e_s"]["p50"], r["concurrency"]) for r in report["levels"][name]
               if r["e2e_s"]["p50"] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **style)
        for x, y, c in pts:
            ax.annotate(f"c={c}", (x, y), fontsize=8)
    ax.set(xlabel="throughput (output tokens/s)", ylabel="p50 end-to-end latency (s)",
           title="llama-server vs specray serve, same GGUF")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_side_by_side(args) -> int:
    """Start both servers, drive each level on one then the other, write side_by_side.{json,md,png}."""
    import httpx
    from tqdm import tqdm

    from specray.cluster.serve.http_server import free_port

    model = args.model or "smollm2-135m"
    binary, gguf = find_llama_server(args.llama_cpp), gguf_of(model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = args.threads or len(os.sched_getaffinity(0))
    ports = {name: free_port() for name in SERVERS}
    ctx = args.llama_ctx or 2048 * args.llama_parallel
    llama_cmd = llama_server_command(binary, gguf, ports["llama-server"], threads, args.llama_parallel, ctx,
                                     args.llama_args)
    commands = {"llama-server": llama_cmd, "specray": specray_command(model, ports["specray"], free_port(),
                                                                       args.specray_args)}
    urls = {name: f"http://127.0.0.1:{ports[name]}" for name in SERVERS}
    levels: dict[str, list[dict]] = {name: [] for name in SERVERS}
    with Server("llama-server", commands["llama-server"], urls["llama-server"], out / "llama-server.log"), \
            Server("specray serve", commands["specray"], urls["specray"], out / "specray.log"):
        bodies = {name: request_bodies(args, first_model(httpx, urls[name], {})) for name in SERVERS}
        for body in bodies["llama-server"]:  # levels repeat the prompts: no slot may reuse a cached prefill
            body["cache_prompt"] = False
        categories = [b["category"] for b in bodies["specray"]]
        for i, c in enumerate(args.concurrency):
            for name in (SERVERS if i % 2 == 0 else SERVERS[::-1]):
                with tqdm(total=len(bodies[name]), desc=f"{name} (concurrency {c})", mininterval=1) as bar:
                    samples, seconds = asyncio.run(run_level(urls[name], {}, bodies[name], args.endpoint == "chat",
                                                             c, None, c, bar, keepalive=False))
                levels[name].append(summarise(c, None, samples, seconds, categories))
    levels = {name: sorted(rows, key=lambda r: r["concurrency"]) for name, rows in levels.items()}
    report = {"schema": SCHEMA, "model": model, "gguf": gguf.name, "endpoint": args.endpoint,
              "num_requests": args.num_requests, "max_tokens": args.max_tokens, "temperature": args.temperature,
              "ignore_eos": args.ignore_eos, "dataset": args.dataset, "threads": threads,
              "llama_command": [binary.name, *llama_cmd[1:]], "specray_args": args.specray_args,
              "levels": levels, "comparison": compare(levels)}
    (out / "side_by_side.json").write_text(json.dumps(report, indent=2))
    (out / "side_by_side.md").write_text(markdown(report))
    plot(report, out / "side_by_side.png")
    print(markdown(report))
    return 0
