"""`specray bench diffusion`: static decoding vs FreeDave on a diffusion LM, in one run.

For each batch size, every num_drafts value decodes the same prompts in rotating order (so drift of a
shared machine falls on all of them alike); outputs must be identical to static decoding's (K = 1).
Reported: tokens/s, model calls per token, static steps per call, canvases scored per call, and ms per
call: how far a call's cost is from flat in the number of drafts, which decides whether fewer calls
mean less time. `--random-llada` adds a random model with LLaDA-8B's layer shapes scaled down.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specray.cluster.args import non_negative_int, out_folder, positive_int, positive_int_list, positive_ints_or_none
from specray.kernels.diffusion.decoding import DecodeOptions
from specray.kernels.diffusion.engine import decode_greedy

# LLaDA-8B: d_model 4096, 32 heads, MLP 12288, vocabulary 126464; scaled to a quarter of the width
LLADA_SCALED = {"d_model": 1024, "n_heads": 8, "n_kv_heads": 8, "mlp_hidden_size": 3072, "vocab_size": 126464,
                "rope_theta": 500000.0, "max_sequence_length": 4096, "mask_token_id": 126336, "eos_token_id": 126081}


@dataclass
class Cell:
    model: str
    batch_size: int
    num_drafts: int
    adaptive: bool
    tokens: int
    seconds: float
    model_calls: int  # engine calls (one a round for the whole batch)
    steps: int  # static steps, all sequences
    canvases: int
    seq_calls: int = 0  # calls each sequence took part in, summed: calls per token are per sequence

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def row(self) -> dict:
        return {**asdict(self), "tokens_per_s": round(self.tokens_per_s, 2),
                "calls_per_token": round(self.seq_calls / self.tokens, 3),
                "steps_per_call": round(self.steps / self.seq_calls, 3),
                "canvases_per_call": round(self.canvases / self.model_calls, 2),
                "ms_per_call": round(1000 * self.seconds / self.model_calls, 1)}


def decode(model, prompts: list[list[int]], max_tokens: int, options: DecodeOptions, eos: frozenset[int]):
    """-> (outputs, seconds, metrics): greedy, all prompts in one running batch, cut at EOS."""
    start = time.perf_counter()
    outputs, metrics = decode_greedy(model, prompts, max_tokens, options, eos)
    return outputs, time.perf_counter() - start, metrics


def bench_model(name: str, model, prompts: list[list[int]], max_tokens: int, batch_sizes: list[int],
                drafts: list[tuple[int, bool]], block_length: int, eos: frozenset[int], log=print) -> list[dict]:
    """`drafts`: (num_drafts, adaptive) variants, static decoding (1, False) first."""
    rows = []
    for k in drafts:  # warm-up: the first calls pay one-off allocations, and with one group static always went first
        decode(model, prompts[:1], min(max_tokens, block_length), DecodeOptions(block_length, num_drafts=k[0],
                                                                                adaptive=k[1]), eos)
    for b in batch_sizes:
        groups = [prompts[i:i + b] for i in range(0, len(prompts), b)]
        cells = {k: Cell(name, b, k[0], k[1], 0, 0.0, 0, 0, 0) for k in drafts}
        for g, group in enumerate(groups):
            order = drafts[g % len(drafts):] + drafts[:g % len(drafts)]  # rotate who goes first
            outputs = {}
            for k in order:
                options = DecodeOptions(block_length, num_drafts=k[0], adaptive=k[1])
                outs, seconds, m = decode(model, group, max_tokens, options, eos)
                outputs[k] = outs
                c = cells[k]
                c.tokens += sum(len(o) for o in outs)
                c.seconds += seconds
                c.model_calls, c.steps, c.canvases = c.model_calls + m.model_calls, c.steps + m.steps, c.canvases + m.canvases
                c.seq_calls += sum(m.per_seq_calls.values())
            assert all(o == outputs[drafts[0]] for o in outputs.values()), "FreeDave changed an output"
        for k in drafts:
            rows.append(cells[k].row())
            log(f"{name} batch {b} K={k[0]}{' adaptive' if k[1] else ''}: {rows[-1]['tokens_per_s']} tok/s, "
                f"{rows[-1]['calls_per_token']} calls/token, "
                f"{rows[-1]['ms_per_call']} ms/call")
    return rows


def random_llada(layers: int, seed: int = 0):
    from specray.kernels.diffusion.config import diffusion_config
    from specray.kernels.diffusion.model import DiffusionModel

    torch.manual_seed(seed)
    model = DiffusionModel(diffusion_config({"model_type": "llada", "n_layers": layers, **LLADA_SCALED}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02 if "embed" in name or "lm_head" in name else p.shape[1] ** -0.5)
    return model.eval()


def markdown(rows: list[dict]) -> str:
    lines = ["| model | batch | K | tokens/s | vs static | calls/token (a sequence's) | steps/call | canvases/call | ms/call |",
             "|---|---|---|---|---|---|---|---|---|"]
    static = {(r["model"], r["batch_size"]): r for r in rows if r["num_drafts"] == 1 and not r["adaptive"]}
    for r in rows:
        base = static.get((r["model"], r["batch_size"]))
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        k = f"{r['num_drafts']}{' adaptive' if r['adaptive'] else ''}"
        lines.append(f"| {r['model']} | {r['batch_size']} | {k} | {r['tokens_per_s']} | {ratio} | "
                     f"{r['calls_per_token']} | {r['steps_per_call']} | {r['canvases_per_call']} | {r['ms_per_call']} |")
    return "\n".join(lines) + "\n"


def cmd_bench_diffusion(args) -> int:
    from specray.cluster.bench.prompts import load_prompts
    from specray.kernels.chat import prompt_token_ids
    from specray.kernels.diffusion.weights import load_diffusion_model
    from specray.kernels.loader import resolve

    if args.threads:
        torch.set_num_threads(args.threads)
    if 1 not in args.num_drafts:
        raise ValueError("--num-drafts must include 1 (static decoding, the reference and the baseline)")
    drafts = [(1, False)] + [(k, False) for k in args.num_drafts if k != 1] + [(k, True) for k in args.adaptive]
    rows = []
    if args.model != "none":
        checkpoint = resolve(args.model)
        model, tok = load_diffusion_model(checkpoint.path), checkpoint.tokenizer()
        texts = [p["prompt"] for p in load_prompts(Path(args.dataset) if args.dataset else None, args.num_prompts)]
        prompts = [prompt_token_ids(tok, t) for t in texts]
        eos = frozenset(model.config.model.eos_token_ids or [tok.eos_token_id])
        rows += bench_model(args.model, model, prompts, args.max_tokens, args.batch_sizes, drafts, args.block_length, eos)
    if args.random_llada:
        model = random_llada(args.random_llada)
        g = torch.Generator().manual_seed(0)
        top = min(model.config.model.vocab_size, model.config.mask_token_id)  # ids below the mask token
        prompts = [torch.randint(0, top, (int(n),), generator=g).tolist()
                   for n in torch.randint(16, 48, (args.random_prompts,), generator=g)]
        rows += bench_model(f"random-llada-{args.random_llada}l", model, prompts, args.random_max_tokens,
                            args.batch_sizes, drafts, args.block_length, frozenset())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), "args": vars(args) | {"func": None}}
    (out / "diffusion.json").write_text(json.dumps({"info": info, "rows": rows}, indent=2, default=str))
    (out / "diffusion.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0


def add_diffusion_bench_parser(kinds) -> None:
    from specray.cluster.bench.prompts import SHARED_PROMPTS

    p = kinds.add_parser("diffusion", help="static decoding vs FreeDave on a diffusion LM (calls, tokens/s)")
    p.add_argument("--model", default="smollm2-135m-dllm", help="diffusion LM: alias or LLaDA/Dream folder; none: "
                   "only --random-llada")
    p.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                   help="JSONL with Spec-Bench 'turns' or 'prompt' (default: Spec-Bench if present, else the "
                        "packaged subset)")
    p.add_argument("--num-prompts", type=positive_int, default=16, help="prompts, round-robin over categories")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="new tokens a prompt (the canvas: whole blocks)")
    p.add_argument("--batch-sizes", type=positive_int_list, default=[1, 8], help="comma-separated, e.g. 1,8")
    p.add_argument("--num-drafts", type=positive_int_list, default=[1, 2, 4, 8], help="FreeDave's K values; 1 = static")
    p.add_argument("--adaptive", type=positive_ints_or_none, default=[4], help="FreeDave with adaptive drafts up to these K "
                   "(comma-separated; empty: none)")
    p.add_argument("--block-length", type=positive_int, default=32, help="semi-autoregressive block")
    p.add_argument("--random-llada", type=non_negative_int, default=0, metavar="LAYERS",
                   help="also a random LLaDA-8B-shaped model (width / 4) of this many layers (0: not)")
    p.add_argument("--random-prompts", type=positive_int, default=8, help="random-model prompts (16-47 random tokens)")
    p.add_argument("--random-max-tokens", type=positive_int, default=32, help="random-model new tokens a prompt")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--out", type=out_folder, default="bench_out", help="folder for diffusion.{json,md}")
    p.set_defaults(func=cmd_bench_diffusion)
