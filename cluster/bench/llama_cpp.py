"""llama.cpp rows in `specray bench offline`, on the same GGUF and threads: `llama-bench` at batch 1
(generation only), `llama-lookup` (its prompt-lookup speculation, greedy, on the run's prompts),
`llama-speculative-simple` (its draft-model speculation with the run's standalone draft, written as a
GGUF file by cluster/bench/draft_gguf.py) and `llama-batched-bench` at the batch sizes above 1
(128-token prompts; generated tokens over the whole time, prefill included, as specray's rows count
them).
Benchmarks only: the build comes from `scripts/build_llama_cpp.sh` (specray's cache) or --llama-cpp;
a binary the build lacks is a row not run, said in the log."""

from __future__ import annotations

import json
import os
import re
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


def _run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise ValueError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return done


def llama_bench_cell(binary: Path, gguf: Path, max_tokens: int, threads: int, repetitions: int = 3) -> Cell:
    """`llama-bench -p 0 -n max_tokens` (generation only) -> a batch-1, temperature-0 row."""
    command = [str(binary), "-m", str(gguf), "-p", "0", "-n", str(max_tokens), "-t", str(threads),
               "-r", str(repetitions), "-o", "json"]
    done = _run(command)
    records = [r for r in json.loads(done.stdout) if r.get("n_gen")]
    if not records:
        raise ValueError(f"llama-bench reported no generation test: {done.stdout[:200]}")
    tokens = int(records[0]["n_gen"]) * repetitions
    return Cell("llama_bench", 1, 0.0, requests=repetitions, tokens=tokens, seconds=tokens / float(records[0]["avg_ts"]))


def speculation_cell(method: str, command: list[str], prompts: list[str]) -> Cell:
    """`command -p PROMPT` (greedy, past EOS as specray's rows) on each chat-templated prompt -> a
    batch-1 row: decode time and drafts from its log."""
    cell = Cell(method, 1, 0.0)
    for prompt in prompts:
        done = _run([*command, "-p", prompt])
        log = done.stderr + done.stdout
        decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        drafted, accepted = re.search(r"n_drafted\s*=\s*(\d+)", log), re.search(r"n_accept\s*=\s*(\d+)", log)
        if not (decoded and drafted and accepted):
            raise ValueError(f"{Path(command[0]).name} printed no decode statistics: {log.strip()[-300:]}")
        cell.requests += 1
        cell.tokens += int(decoded.group(1)) - 1  # its count includes the token the prompt's pass drew
        cell.seconds += float(decoded.group(2))
        cell.drafted += int(drafted.group(1))
        cell.accepted += int(accepted.group(1))
    return cell


def llama_lookup_cell(binary: Path, gguf: Path, prompts: list[str], max_tokens: int, threads: int,
                      num_draft: int) -> Cell:
    """`llama-lookup --temp 0`: llama.cpp's prompt lookup."""
    return speculation_cell("llama_lookup", [
        str(binary), "-m", str(gguf), "-n", str(max_tokens), "-t", str(threads), "--spec-draft-n-max", str(num_draft),
        "--temp", "0", "-c", "4096", "--ignore-eos"], prompts)


def llama_speculative_cell(binary: Path, gguf: Path, draft: Path, prompts: list[str], max_tokens: int,
                           threads: int, num_draft: int) -> Cell:
    """`llama-speculative-simple --temp 0` with a draft GGUF: llama.cpp's draft-model speculation."""
    return speculation_cell("llama_speculative", [
        str(binary), "-m", str(gguf), "-md", str(draft), "--spec-type", "draft-simple", "-n", str(max_tokens),
        "-t", str(threads), "--spec-draft-n-max", str(num_draft), "--temp", "0", "-c", "4096", "--ignore-eos"], prompts)


def llama_batched_cells(binary: Path, gguf: Path, batch_sizes: list[int], max_tokens: int, threads: int) -> list[Cell]:
    """`llama-batched-bench -npp 128 -ntg max_tokens -npl B,...` -> one greedy row a batch size:
    generated tokens of all sequences over its total time T (prefill included)."""
    command = [str(binary), "-m", str(gguf), "-c", str(max(batch_sizes) * (128 + max_tokens) + 64), "-b", "2048",
               "-ub", "512", "-npp", "128", "-ntg", str(max_tokens), "-npl", ",".join(map(str, batch_sizes)),
               "-t", str(threads), "--output-format", "jsonl"]
    done = _run(command)
    rows = [json.loads(line) for line in (done.stdout + "\n" + done.stderr).splitlines() if line.startswith("{")]
    cells = []
    for r in rows:
        tokens = int(r["pl"]) * int(r["tg"])
        cells.append(Cell("llama_batched", int(r["pl"]), 0.0, requests=int(r["pl"]), tokens=tokens, seconds=float(r["t"])))
    if len(cells) != len(batch_sizes):
        raise ValueError(f"llama-batched-bench reported {len(cells)} of {len(batch_sizes)} batch sizes")
    return cells


def llama_cells(args, threads: int, log=print, prompts: list[str] | None = None) -> list[Cell]:
    """The llama.cpp rows the flags and the cache allow (none for a model that is no GGUF file)."""
    from specray.cluster.bench.side_by_side import gguf_of

    if args.llama_cpp == "none" or 0.0 not in args.temperatures:
        return []
    try:
        gguf = gguf_of(args.model)
    except ValueError:
        log(f"{args.model} is no GGUF file: no llama.cpp rows")
        return []
    cells = []
    folder = None if args.llama_cpp is None else Path(args.llama_cpp).expanduser()
    if folder is not None and not folder.is_dir():
        raise ValueError(f"--llama-cpp {args.llama_cpp}: not a folder (a llama.cpp build's bin folder)")
    for name in ("llama-bench", "llama-lookup", "llama-speculative-simple", "llama-batched-bench"):
        binary = find_llama_binary(name, None) if folder is None else \
            (folder / name if os.access(folder / name, os.X_OK) else None)
        if binary is None:
            log(f"no {name} in {folder or llama_cache()}: its rows are not run (scripts/build_llama_cpp.sh builds it)")
            continue
        try:
            cells += _rows(name, binary, gguf, args, threads, prompts)
        except ValueError as e:  # a build that takes other flags: the other rows still run
            log(f"{name}: {e}")
    return cells


def _rows(name: str, binary: Path, gguf: Path, args, threads: int, prompts: list[str] | None) -> list[Cell]:
    cells = []
    if name == "llama-bench" and 1 in args.batch_sizes:
        cells.append(llama_bench_cell(binary, gguf, args.max_tokens, threads))
    elif name == "llama-lookup" and prompts and 1 in args.batch_sizes:
        cells.append(llama_lookup_cell(binary, gguf, prompts, args.max_tokens, threads, args.num_speculative_tokens))
    elif name == "llama-batched-bench" and [b for b in args.batch_sizes if b > 1]:
        cells += llama_batched_cells(binary, gguf, [b for b in args.batch_sizes if b > 1], args.max_tokens, threads)
    elif name == "llama-speculative-simple" and prompts and 1 in args.batch_sizes:
        draft = llama_draft_file(getattr(args, "draft_model", None), gguf)
        cells.append(llama_speculative_cell(binary, gguf, draft, prompts, args.max_tokens, threads,
                                            args.num_speculative_tokens))
    return cells


def llama_draft_file(draft: str | None, target: Path) -> Path:
    """The run's standalone draft as llama.cpp loads it: a .gguf as given, a checkpoint folder or
    alias written once into specray's cache with the target's tokenizer."""
    from specray.cluster.bench.draft_gguf import cached_draft_gguf
    from specray.kernels.loader import resolve

    if not draft:
        raise ValueError("no standalone draft to run it with (--draft-model; smollm2-135m has a packaged one)")
    if draft.endswith(".gguf"):
        return Path(draft).expanduser()
    return cached_draft_gguf(resolve(draft).path, target)
