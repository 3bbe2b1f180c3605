"""llama.cpp rows in `specray bench offline`: `llama-bench` on the same GGUF at batch 1 (greedy
decoding speed, prefill excluded, as specray's rows report it). Benchmarks only: the build comes
from `scripts/build_llama_cpp.sh` (specray's cache) or --llama-cpp."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from specray.cluster.bench.offline import Cell


def llama_cache() -> Path:
    from specray.kernels.loader import cache_root

    return cache_root() / "llama.cpp"


def find_llama_binary(name: str, given: str | None) -> Path | None:
    """`name` in --llama-cpp (a build's bin folder or the binary), else the newest build in specray's
    cache; None when there is none (a given path without it is an error)."""
    if given:
        path = Path(given).expanduser()
        binary = path / name if path.is_dir() else path
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ValueError(f"no {name} executable at {binary}")
        return binary
    builds = sorted(llama_cache().glob(f"*/bin/{name}"), key=lambda p: p.stat().st_mtime)
    return builds[-1] if builds else None


def llama_bench_cell(binary: Path, gguf: Path, max_tokens: int, threads: int, repetitions: int = 3) -> Cell:
    """`llama-bench -p 0 -n max_tokens` (generation only) -> a batch-1, temperature-0 row."""
    command = [str(binary), "-m", str(gguf), "-p", "0", "-n", str(max_tokens), "-t", str(threads),
               "-r", str(repetitions), "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise ValueError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    records = [r for r in json.loads(done.stdout) if r.get("n_gen")]
    if not records:
        raise ValueError(f"llama-bench reported no generation test: {done.stdout[:200]}")
    tokens = int(records[0]["n_gen"]) * repetitions
    return Cell("llama_bench", 1, 0.0, requests=repetitions, tokens=tokens, seconds=tokens / float(records[0]["avg_ts"]))


def llama_cells(args, threads: int, log=print) -> list[Cell]:
    """The llama.cpp rows the flags and the cache allow (none for a model that is no GGUF file)."""
    from specray.cluster.bench.side_by_side import gguf_of

    if args.llama_cpp == "none" or 1 not in args.batch_sizes or 0.0 not in args.temperatures:
        return []
    binary = find_llama_binary("llama-bench", args.llama_cpp)
    if binary is None:
        log(f"no llama-bench in {llama_cache()}: no llama.cpp rows (scripts/build_llama_cpp.sh builds one)")
        return []
    try:
        gguf = gguf_of(args.model)
    except ValueError:
        log(f"{args.model} is no GGUF file: no llama.cpp rows")
        return []
    return [llama_bench_cell(binary, gguf, args.max_tokens, threads)]
