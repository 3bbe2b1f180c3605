"""`specray bench offline`: specray against transformers on the same prompts, machine and run.

The matrix is methods x batch sizes x temperatures. Within one (batch size, temperature) the
methods run round-robin per group of prompts, so machine noise hits them alike and ratios stay
meaningful. Results go to JSON (`bench_report.SCHEMA`), Markdown and PNG (see bench_report).
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from specray.cluster.bench.bound import Bandwidth
from specray.cluster.bench.methods import (HF_METHODS, KERNEL_SUFFIXES, LONGSPEC_METHODS, METHODS, base_method,
                                            default_methods, engine_of, is_padded, kernels_of, known_method,
                                            needs_padding, skip_reason, tree_configs, tree_shapes)
from specray.cluster.bench.prompts import load_prompts
from specray.cluster.config.defaults import default_speculative_config
from specray.kernels.chat import prompt_token_ids
from specray.kernels.ints import ceil_div

@dataclass
class CategoryCounts:
    """A cell's batch-1 share for one prompt category."""

    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    emitted: int = 0
    requests: int = 0
    prefill_seconds: float = 0.0  # target steps that held a prefill (batch 1: the prompt's)

    def add(self, cell: "Cell", before: tuple) -> None:
        """Add what `cell` counted since `before` (its `snapshot()`)."""
        now = cell.snapshot()
        self.tokens += now[0] - before[0]
        self.seconds += now[1] - before[1]
        self.rounds += now[2] - before[2]
        self.emitted += now[3] - before[3]
        self.requests += now[4] - before[4]
        self.prefill_seconds += now[5] - before[5]


@dataclass
class Cell:
    """One (method, batch size, temperature) measurement, summed over its prompt groups."""

    method: str
    batch_size: int
    temperature: float
    skipped: str | None = None  # why this combination was not run
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)
    per_category: dict[str, CategoryCounts] = field(default_factory=dict)  # batch size 1 only

    prefill_seconds: float = 0.0

    def snapshot(self) -> tuple:
        return self.tokens, self.seconds, self.rounds, self.emitted, self.requests, self.prefill_seconds


class Runner:
    """Loads every model once; `run(method, group, temperature)` generates for a group of prompts."""

    def __init__(self, args, methods: list[str], encoded: list[list[int]]):
        from specray import LLM
        from specray.cluster.bench.hf_baselines import load_hf, truncated_assistant
        from specray.kernels.loader import resolve

        self.args, self.ckpt = args, resolve(args.model)
        self.bandwidth: Bandwidth | None = None  # this run's; sets the bound
        k, max_seqs = args.num_speculative_tokens, max(args.batch_sizes)
        draft = {"method": "draft_model", "model": args.draft_model or args.model,
                 "draft_num_layers": args.draft_num_layers, "num_speculative_tokens": k}
        configs = {"specray": None, "specray_default": default_speculative_config(args.model),
                   "specray_ngram": {"method": "ngram", "num_speculative_tokens": k},
                   "specray_draft": draft,
                   "specray_easyspec": {**draft, "layer_parallel": args.layer_parallel},  # EasySpec
                   "specray_eagle": {"method": "eagle", "model": args.eagle_model,
                                     "num_speculative_tokens": args.eagle_k or k}}
        tree_draft = ({"method": "eagle", "model": args.eagle_model} if args.eagle_model
                      else {key: draft[key] for key in ("method", "model", "draft_num_layers")})
        configs.update(tree_configs(k, tree_draft))
        longspec = {"method": "longspec", "model": args.longspec_model, "num_speculative_tokens": k}
        configs.update({"specray_draft_topk": {**draft, "tree": tree_shapes(k)["topk"]}, "specray_longspec": longspec,
                        "specray_longspec_topk": {**longspec, "tree": tree_shapes(k)["topk"]}})
        wanted = {engine_of(m) for m in methods}  # a padded method reuses its engine
        kv_k = max(k, args.eagle_k or 0)
        with warnings.catch_warnings():  # a mode the weights do not take: its cells say so (skip_reason)
            warnings.filterwarnings("ignore", message=".*found no GGUF Q4_1/Q8_0 weights")
            self.llms = {m: LLM(args.model, speculative_config=configs[base_method(m)], max_num_seqs=max_seqs,
                                kv_cache_tokens=kv_tokens_needed(encoded, args.batch_sizes, args.max_tokens, kv_k,
                                                                 padded=needs_padding(m, methods)),
                                kernels=kernels_of(m),
                                enable_prefix_caching=False)  # every cell sends the same prompts: each computes them
                         for m in sorted(wanted) if base_method(m) in configs}
        self.hf = load_hf(self.ckpt.path) if any(m in HF_METHODS for m in methods) else None
        self.assistant = None
        if "hf_assisted" in methods:  # the very draft specray_draft uses
            base = load_hf(resolve(args.draft_model).path) if args.draft_model else self.hf
            self.assistant = truncated_assistant(base, args.draft_num_layers)

    def skip_reason(self, method: str, batch_size: int) -> str | None:
        """`methods.skip_reason`, or a kernel mode the model's weights do not take (its engine loaded exact)."""
        llm, mode = self.llms.get(engine_of(method)), kernels_of(method)
        if llm is not None and llm.target.model.kernel_mode != mode:
            return f"the model has no GGUF Q4_1/Q8_0 weights: its {mode} would run as exact"
        return skip_reason(method, batch_size)

    def run(self, method: str, group: list[list[int]], temperature: float, seed: int, cell: Cell) -> None:
        start = time.perf_counter()
        if method in HF_METHODS:
            outs = self._run_hf(method, group, temperature, seed)
        else:
            outs = self._run_specray(method, group, temperature, seed, cell)
        cell.seconds += time.perf_counter() - start
        cell.requests += len(group)
        cell.tokens += sum(len(o) for o in outs)
        cell.outputs.extend(outs)

    def _run_hf(self, method, group, temperature, seed) -> list[list[int]]:
        from specray.cluster.bench.hf_baselines import hf_generate

        kw = {}
        if method == "hf_prompt_lookup":
            kw["prompt_lookup_num_tokens"] = self.args.hf_prompt_lookup_tokens
        elif method == "hf_assisted":
            kw["assistant_model"] = self.assistant
        return hf_generate(self.hf, group, self.args.max_tokens, temperature, seed, **kw)

    def _run_specray(self, method, group, temperature, seed, cell: Cell) -> list[list[int]]:
        from specray import SamplingParams

        llm = self.llms[engine_of(method)]
        llm.target.pad_batches = is_padded(method)
        params = [SamplingParams(temperature=temperature, max_tokens=self.args.max_tokens, ignore_eos=True,
                                 seed=seed + i) for i in range(len(group))]
        stats = llm.router.stats
        before = (stats.steps, stats.draft_seconds, stats.target_seconds, stats.prefill_seconds)
        outs = llm.generate([{"prompt_token_ids": ids} for ids in group], params)
        cell.steps += stats.steps - before[0]
        cell.draft_seconds += stats.draft_seconds - before[1]
        cell.target_seconds += stats.target_seconds - before[2]
        cell.prefill_seconds += stats.prefill_seconds - before[3]
        for o in outs:
            m = o.metrics
            cell.rounds += m.num_rounds
            cell.emitted += m.num_emitted_tokens
            cell.drafted += m.num_draft_tokens
            cell.accepted += m.num_accepted_tokens
        llm.target.pad_batches = False
        return [o.outputs[0].token_ids for o in outs]


def kv_tokens_needed(encoded: list[list[int]], batch_sizes: list[int], max_tokens: int, k: int,
                     padded: bool = False, block_size: int = 16) -> int:
    """KV slots for the largest group at once: its prompts, new tokens, a round's draft tree (at most
    4k nodes in these shapes) and a partly filled block each; `padded` (the baseline pads every
    sequence to the group's longest): group size x its longest. Sized per group, not as the largest
    batch x the longest prompt: one engine per method, fourteen of them, must fit in memory together."""
    extra = max_tokens + 4 * k + 2 * block_size
    groups = [encoded[g:g + b] for b in batch_sizes for g in range(0, len(encoded), b)]
    if padded:
        return max(len(group) * (max(len(ids) for ids in group) + extra) for group in groups)
    return max(sum(len(ids) + extra for ids in group) for group in groups)


def run_matrix(args, on_row=None) -> tuple[list[Cell], list[dict], Runner]:
    """Every (batch size, temperature) row in turn; `on_row(cells so far, prompts, runner)` after each,
    so a long run leaves its finished rows on disk whatever happens later."""
    from tqdm import tqdm

    from specray.cluster.config.defaults import packaged_draft

    if args.eagle_model is None:  # the target's packaged drafts, where it has them
        args.eagle_model = packaged_draft(args.model, "eagle")
    if args.draft_model is None:  # else specray_draft and hf_assisted run the target, truncated
        args.draft_model = packaged_draft(args.model, "draft_model")
    if args.longspec_model is None:
        args.longspec_model = packaged_draft(args.model, "longspec")
    methods = [m for m in (args.methods or default_methods(args)).split(",") if m]
    args.methods = ",".join(methods)
    unknown = sorted(m for m in methods if not known_method(m))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}, or a specray method + "
                         f"one of {list(KERNEL_SUFFIXES)} (that kernel mode)")
    if "specray_eagle" in methods and not args.eagle_model:
        raise ValueError("method specray_eagle needs --eagle-model (a feature-level draft, `specray distill --kind eagle`)")
    if set(methods) & set(LONGSPEC_METHODS) and not args.longspec_model:
        raise ValueError("methods specray_longspec* need --longspec-model (`specray distill --kind longspec`)")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        raise ValueError("batch sizes must be positive integers")
    from specray.kernels.loader import resolve

    prompts = load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)
    tok = resolve(args.model).tokenizer()
    encoded = [prompt_token_ids(tok, p["prompt"])
               for p in prompts]
    for b in args.batch_sizes:
        if b > len(encoded):  # the row is real, but its groups are smaller than its label says
            print(f"specray bench offline: warning: batch size {b} > {len(encoded)} prompts; that row runs "
                  f"{len(encoded)} sequences at once (raise --num-prompts)", file=sys.stderr)
    runner = Runner(args, methods, encoded)
    cells = []
    for m in tqdm(methods, desc="bench offline (load, warm up)"):  # first calls pay one-off allocation costs
        if runner.skip_reason(m, 1) is None:
            runner.run(m, encoded[:1], 0.0, 0, Cell(m, 1, 0.0))
    target = next(iter(runner.llms.values())).target.model if runner.llms else None
    if target is not None:  # the bandwidth, this run; the bound's step reads weight_bytes at it
        runner.bandwidth = Bandwidth.measure(target)
    plan = [(b, t) for t in args.temperatures for b in args.batch_sizes]
    bar = tqdm(total=sum(ceil_div(len(encoded), b) for b, _ in plan), desc="bench offline (prompt groups)")
    for batch_size, temperature in plan:
        row = {m: Cell(m, batch_size, temperature, runner.skip_reason(m, batch_size)) for m in methods}
        for g in range(0, len(encoded), batch_size):
            group = encoded[g:g + batch_size]
            for m, cell in row.items():
                if cell.skipped is None:
                    before = cell.snapshot()
                    runner.run(m, group, temperature, seed=g, cell=cell)
                    if batch_size == 1:  # per category only where a group is one prompt
                        cell.per_category.setdefault(prompts[g]["category"], CategoryCounts()).add(cell, before)
            bar.update(1)
        cells.extend(row.values())
        if on_row is not None:
            on_row(cells, prompts, runner)
    bar.close()
    return cells, prompts, runner


def chat_texts(model: str, prompts: list[dict]) -> list[str]:
    """Each prompt as the chat-templated text of the token ids specray's rows run (special tokens
    spelled out), for llama.cpp's tools, which tokenize `-p` as given."""
    from specray.kernels.loader import resolve

    tok = resolve(model).tokenizer()
    return [tok.decode(prompt_token_ids(tok, p["prompt"]), skip_special_tokens=False) for p in prompts]


def cmd_bench_offline(args) -> int:
    from specray.cluster.bench.long_context import long_context_rows
    from specray.cluster.bench.long_context import markdown as long_markdown
    from specray.cluster.bench.long_context import plot as long_plot
    from specray.cluster.bench.report import build_report, write_outputs

    if args.quick:
        args.num_prompts, args.max_tokens = min(args.num_prompts, 4), min(args.max_tokens, 48)
        args.batch_sizes = [b for b in args.batch_sizes if b <= 4] or [1]
    def report(cells, prompts, runner, partial: bool) -> dict:
        out = build_report(args, cells, prompts, runner.bandwidth, partial)
        if any("context_tokens" in p for p in prompts):
            out["long_context"] = long_context_rows(cells, prompts, runner.llms, args.max_tokens)
        return out

    cells, prompts, runner = run_matrix(
        args, on_row=lambda c, p, r: write_outputs(report(c, p, r, True), Path(args.out), partial=True))
    from specray.cluster.bench.llama_cpp import llama_cells

    import torch

    cells += llama_cells(args, torch.get_num_threads(), prompts=chat_texts(args.model, prompts))
    final = report(cells, prompts, runner, False)
    for path in write_outputs(final, Path(args.out)):
        print(f"wrote {path}")
    if final.get("long_context"):
        Path(args.out, "long_context.md").write_text(long_markdown(final["long_context"]))
        long_plot(final["long_context"], Path(args.out, "long_context.png"))
        print(long_markdown(final["long_context"]))
    return 0
