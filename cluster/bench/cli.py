"""`specray bench offline|serve|cluster`: the command group; each benchmark adds its own flags."""

from __future__ import annotations

from specray.cluster.args import name_list, non_negative_float_list, out_folder, positive_int, positive_int_list
from specray.cluster.bench.cluster import add_cluster_bench_parser
from specray.cluster.bench.diffusion import add_diffusion_bench_parser
from specray.cluster.bench.easyspec import add_easyspec_parser
from specray.cluster.bench.methods import METHODS
from specray.cluster.bench.offline import cmd_bench_offline
from specray.cluster.bench.prompts import LONG_CONTEXT, SHARED_PROMPTS
from specray.cluster.bench.serve import add_serve_bench_parser


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)
    off = kinds.add_parser("offline", help="specray vs transformers: methods x batch sizes x temperatures, one run")
    off.add_argument("--model", default="smollm2-135m", help="target: alias, HF folder or .gguf file")
    off.add_argument("--dataset", default=str(SHARED_PROMPTS) if SHARED_PROMPTS.exists() else None,
                     help="JSONL with Spec-Bench 'turns' or 'prompt' (default: Spec-Bench if present, else "
                          "the packaged subset); rows with 'context_tokens' (the packaged long-context set, "
                          f"{LONG_CONTEXT}) add the long-context table")
    off.add_argument("--num-prompts", type=positive_int, default=16, help="prompts a cell, round-robin over categories")
    off.add_argument("--max-tokens", type=positive_int, default=128, help="new tokens a prompt")
    off.add_argument("--methods", type=name_list, default=None, help=f"comma-separated from {list(METHODS)} (default: all; "
                     "specray_eagle with a feature-level draft; trees, drafted by it where there is one, "
                     "else by --draft-model, not in --quick); a specray method + '_fast16' or '_fast' (e.g. "
                     "specray_fast16, specray_eagle_fast) runs it in that kernel mode, the others in the exact one; "
                     "the default adds specray_fast16 and specray_default_fast16, what `specray serve` runs a GGUF "
                     "in on a CPU (skipped where the weights are no GGUF blocks)")
    off.add_argument("--batch-sizes", type=positive_int_list, default=[1, 4, 8, 16], help="comma-separated, e.g. 1,4,8,16")
    off.add_argument("--temperatures", type=non_negative_float_list, default=[0.0, 1.0],
                     help="comma-separated; 0 is greedy (outputs checked against plain decoding)")
    off.add_argument("--num-speculative-tokens", type=positive_int, default=2, help="draft tokens a round (chains; trees' depth)")
    off.add_argument("--hf-prompt-lookup-tokens", type=positive_int, default=10, help="transformers' prompt_lookup_num_tokens")
    off.add_argument("--draft-model", default=None, help="draft checkpoint for specray_draft, hf_assisted and "
                     "llama.cpp's llama_speculative row (written as a GGUF file for it) "
                     "(default: the target's packaged standalone draft, smollm2-135m-draft for smollm2-135m; "
                     "else the target, truncated to --draft-num-layers)")
    off.add_argument("--draft-num-layers", type=positive_int, default=4,
                     help="layers of the truncated-target draft where no draft model is packaged")
    off.add_argument("--layer-parallel", type=positive_int, default=2,
                     help="specray_easyspec: the draft's middle layers in groups of this many (EasySpec)")
    off.add_argument("--eagle-model", default=None, help="feature-level draft for specray_eagle (method 'eagle'; "
                     "default: the target's packaged one, smollm2-135m-eagle for smollm2-135m)")
    off.add_argument("--longspec-model", default=None, help="LongSpec draft for specray_longspec and "
                     "specray_longspec_topk (method 'longspec'; default: the target's packaged one, if any)")
    off.add_argument("--eagle-k", type=positive_int, default=None,
                     help="num_speculative_tokens for specray_eagle (default: --num-speculative-tokens)")
    off.add_argument("--llama-cpp", default=None, help="llama.cpp build (bin folder) for its rows on the same GGUF, "
                     "greedy: llama-bench, llama-lookup and llama-speculative-simple (with --draft-model) at batch 1, "
                     "llama-batched-bench above it (default: specray's cached build, if any; none: no llama.cpp rows)")
    off.add_argument("--quick", action="store_true", help="4 prompts, 48 tokens, batch sizes <= 4 (~5 min)")
    off.add_argument("--out", type=out_folder, default="bench_out", help="folder for offline.{json,md,png}")
    off.set_defaults(func=cmd_bench_offline)
    add_serve_bench_parser(kinds)
    add_cluster_bench_parser(kinds)
    add_easyspec_parser(kinds)
    add_diffusion_bench_parser(kinds)
