"""`specray` command line: serve, generate, bench, distill."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specray.kernels.drafters.registry import METHODS
from specray.kernels.kernel_modes import KERNEL_SETTINGS

DEFAULT_PROMPT = "Explain speculative decoding to a new engineer in three short paragraphs."


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="smollm2-135m", help="alias, HF checkpoint folder or .gguf file")
    g.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    g.add_argument("--device", default="cpu", help="cpu (default) or cuda[:i]")
    g.add_argument("--kernels", default="auto", choices=list(KERNEL_SETTINGS),
                   help="the target's CPU kernels on GGUF weights: exact (the fp32 model), fast16 (integer dot "
                        "products on 16-bit activations in two 8-bit parts) or fast (8-bit activations); both "
                        "fast modes keep a 16-bit KV cache; auto (default): fast16 for a GGUF model on a CPU in "
                        "fp32, else exact")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="context length served, prompt and output (default: the model's, as the KV cache allows)")
    g.add_argument("--kv-cache-tokens", type=int, default=16384, help="target KV cache size in tokens")
    from specray.cluster.args import json_object

    s = p.add_argument_group("speculation")
    s.add_argument("--speculative-config", type=json_object, default=None,
                   help="the whole speculative_config as JSON, as vLLM takes it (trees, budgets, lookup_first, "
                        "...); not with the other speculation flags")
    s.add_argument("--speculative-method", default=None, choices=[*METHODS, "freedave", "none"],
                   help="default: adaptive ngram (measured best on CPU and on an H100; eagle: the target's "
                        "packaged trained draft behind lookup); freedave for a diffusion LM (its default)")
    s.add_argument("--draft-model", default=None,
                   help="draft checkpoint for draft_model, eagle or longspec, which it names when no method is "
                        "given (default: the target's packaged draft of the method; draft_model: else the target)")
    s.add_argument("--draft-vocab-trim", type=int, default=None,
                   help="VocabTrim size for a distilled draft (default: its recommended k; 0: off)")
    s.add_argument("--draft-num-layers", type=int, default=None, help="keep only the draft's first layers")
    s.add_argument("--draft-quantization", default=None, choices=["q8_0", "q4_1", "none"],
                   help="draft weights: q8_0 (default on CPU: faster drafting), q4_1 (half its bytes) or none; "
                        "lossless whichever")
    s.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="draft tokens per round, at most with --adaptive-speculation (default 4 with the default "
                        "speculation or eagle, adaptive; else 2)")
    s.add_argument("--disable-by-batch-size", type=int, default=None,
                   help="speculation off once this many sequences run (default: 2 with the default speculation "
                        "or eagle, where batches of 2+ decode faster without it on CPU; else never)")
    s.add_argument("--adaptive-speculation", choices=["on", "off"], default=None,
                   help="each round, each sequence drafts the length (at most --num-speculative-tokens) that "
                        "maximises expected tokens per cost, from its acceptance and this machine's measured "
                        "step costs (default: on with the default speculation or eagle, else off)")
    s.add_argument("--lookup-first", action="store_true", help="draft_model / eagle: prompt lookup first: a draft model proposes only where the last tokens never occurred before")
    s.add_argument("--prompt-lookup-min", type=int, default=None,
                   help="ngram: the shortest trailing match that drafts (default 2 with the default speculation, else 1)")
    s.add_argument("--prompt-lookup-max", type=int, default=None, help="ngram: the longest trailing match tried (default 4)")
    from specray.cluster.diffusion_args import add_diffusion_args

    add_diffusion_args(p)


GENERATE_SPEC_FLAGS = ("speculative_method", "draft_model", "num_speculative_tokens", "draft_vocab_trim",
                       "draft_num_layers", "draft_quantization", "disable_by_batch_size", "lookup_first",
                       "adaptive_speculation")


RECIPE_KEYS = ("lookup_first", "prompt_lookup_min", "disable_by_batch_size", "adaptive")
LOOKUP_FLAGS = ("prompt_lookup_min", "prompt_lookup_max")


def refuse_draft_flags(args, method: str) -> None:
    """A draft model's flags beside a method without one (ngram) are an error naming the flag."""
    from specray.cluster.config.speculative import DRAFT_MODEL_KEYS
    from specray.kernels.drafters.registry import methods_where

    for key in ("draft_model", *DRAFT_MODEL_KEYS):
        if getattr(args, key, None) is not None:
            raise ValueError(f"--{key.replace('_', '-')} needs a method with a draft model "
                             f"({methods_where('needs_model')}); --speculative-method {method} drafts by prompt lookup")


def speculative_config(args) -> dict | None:
    from specray.cluster.config.defaults import default_speculative_config, method_recipe, packaged_draft
    from specray.cluster.config.speculative import DRAFT_MODEL_KEYS, method_of_draft
    from specray.cluster.speculation_flags import refuse_beside_none, refuse_beside_speculative_config

    if getattr(args, "speculative_config", None) is not None:  # callers' namespaces may predate the flag
        refuse_beside_speculative_config(args, GENERATE_SPEC_FLAGS + LOOKUP_FLAGS)
        return args.speculative_config
    if args.speculative_method == "none":
        refuse_beside_none(args, GENERATE_SPEC_FLAGS + LOOKUP_FLAGS)
        return None
    default = default_speculative_config(args.model, getattr(args, "device", "cpu"))
    method = args.speculative_method or default["method"]
    if args.speculative_method is None and getattr(args, "draft_model", None):  # a draft names its method, as in serve
        method = method_of_draft(args.draft_model)
    k = args.num_speculative_tokens  # 0 is a value (rejected below), not "unset"
    cfg = {"method": method, "num_speculative_tokens": 2 if k is None else k}
    if method == "ngram":  # a draft model's flags are refused, not dropped
        refuse_draft_flags(args, method)
    else:
        lookup = [f"--{k.replace('_', '-')}" for k in LOOKUP_FLAGS if getattr(args, k, None) is not None]
        if lookup:  # prompt lookup's own flags would be dropped
            raise ValueError(f"{', '.join(lookup)} shape prompt lookup (--speculative-method ngram); "
                             f"{method} ignores them (a draft model looks up first with --lookup-first)")
        # no draft named: the target's packaged draft for this method, else (draft_model) the target,
        # truncated; eagle and longspec need a draft of their own kind (refused, as serve does, without)
        fallback = args.model if method == "draft_model" else None
        cfg["model"] = args.draft_model or packaged_draft(args.model, method) or fallback
        for key in DRAFT_MODEL_KEYS:
            if getattr(args, key) is not None:
                cfg[key] = getattr(args, key)
    recipe = method_recipe(args.model, method, default)
    if recipe is not None and cfg.get("model") == recipe.get("model"):  # the default's or trained draft's extras
        if k is None:
            cfg["num_speculative_tokens"] = recipe["num_speculative_tokens"]
        cfg.update({key: recipe[key] for key in RECIPE_KEYS if key in recipe})
    if method == "ngram":  # the flags over the recipe's
        cfg.update({key: getattr(args, key) for key in LOOKUP_FLAGS if getattr(args, key, None) is not None})
    disable = getattr(args, "disable_by_batch_size", None)  # callers' namespaces may predate the flag
    if disable is not None:
        cfg["disable_by_batch_size"] = disable
    adaptive = getattr(args, "adaptive_speculation", None)
    if adaptive is not None:
        cfg["adaptive"] = adaptive == "on"
    if getattr(args, "lookup_first", False) and not cfg.get("lookup_first"):
        cfg["lookup_first"] = True  # SpeculativeConfig refuses it for methods without a draft model
    return cfg


def read_prompts(args) -> list[str]:
    """The command line's prompts, then the file's (JSONL rows, or one prompt a non-blank line);
    none at all: the demo prompt. A file without prompts or with a bad row is a ValueError."""
    prompts = list(args.prompt)
    for i, prompt in enumerate(prompts):  # argv bytes that are not UTF-8 arrive as lone surrogates
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"prompt {i + 1} of the command line is not UTF-8 text") from None
    if args.file:
        from specray.cluster.bench.prompts import read_lines, read_rows

        path = Path(args.file)
        if path.suffix.lower() == ".jsonl":
            prompts += [row["prompt"] for row in read_rows(path)]
        else:
            prompts += [line for _, line in read_lines(path)]
    return prompts or [DEFAULT_PROMPT]


def cmd_generate(args) -> int:
    from specray import LLM, SamplingParams

    prompts = read_prompts(args)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            max_tokens=args.max_tokens, stop=args.stop or None, ignore_eos=args.ignore_eos)
    from specray.cluster.diffusion_args import diffusion_configs

    diffusion = diffusion_configs(args)
    spec, diffusion_config = diffusion if diffusion else (speculative_config(args), None)
    llm = LLM(args.model, speculative_config=spec, dtype=args.dtype, device=args.device,
              max_model_len=args.max_model_len, kv_cache_tokens=args.kv_cache_tokens,
              diffusion_config=diffusion_config, kernels=args.kernels,
              generation_config="vllm")  # its flags set every sampling option: the model's file is not read
    inputs = ([{"prompt_token_ids": llm.apply_chat_template([{"role": "user", "content": p}])} for p in prompts]
              if args.chat_template else prompts)
    start, printed, finished = time.perf_counter(), {}, []
    for out in llm.stream(inputs, params):
        text = out.outputs[0].text
        if len(prompts) == 1:  # stream one prompt's text as it grows
            sys.stdout.write(text[printed.get(out.request_id, 0):])
            sys.stdout.flush()
            printed[out.request_id] = len(text)
        elif out.finished:
            print(f"--- prompt {out.request_id}: {prompts[int(out.request_id)][:60]!r}\n{text}")
        if out.finished:
            finished.append(out)
    elapsed = time.perf_counter() - start
    print()
    print(summary_line(finished, elapsed, diffusion is not None), file=sys.stderr)
    return 0


def summary_line(outputs, elapsed: float, diffusion: bool = False) -> str:
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    rounds = sum(o.metrics.num_rounds for o in outputs)
    emitted = sum(o.metrics.num_emitted_tokens for o in outputs)
    drafted = sum(o.metrics.num_draft_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    tau = emitted / rounds if rounds else 0.0
    if diffusion:  # rounds are model calls
        steps = sum(o.metrics.num_diffusion_steps for o in outputs)
        return (f"[specray] {len(outputs)} request(s), {tokens} tokens in {elapsed:.2f}s = "
                f"{tokens / max(elapsed, 1e-9):.1f} tokens/s; {rounds / max(emitted, 1):.2f} model calls a token, "
                f"{steps / max(rounds, 1):.2f} static steps a call")
    rate = accepted / drafted if drafted else 0.0
    return (f"[specray] {len(outputs)} request(s), {tokens} tokens in {elapsed:.2f}s = "
            f"{tokens / max(elapsed, 1e-9):.1f} tokens/s; acceptance length {tau:.2f}, "
            f"acceptance rate {rate:.2f} ({accepted}/{drafted} drafted)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specray", description="Lossless speculative decoding on Ray.")
    sub = parser.commands = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text in-process (one prompt streams to the terminal; "
                                          "several run batched, each printed as it finishes)")
    gen.add_argument("prompt", nargs="*", help="prompt text (default: a demo prompt)")
    gen.add_argument("--file", help="prompts, one per line (.txt) or JSONL with 'prompt' or Spec-Bench 'turns'")
    gen.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                     help="send the raw prompt instead of applying the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most a prompt (default 128)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's mass, in (0, 1] (default 1: off)")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    gen.add_argument("--seed", type=int, default=None, help="seed of sampled decoding (default: unseeded)")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true", help="generate past the end-of-sequence token")
    add_model_args(gen)
    gen.set_defaults(func=cmd_generate)
    from specray.cluster.bench.cli import add_bench_parser
    from specray.cluster.serve.cli import add_serve_parser
    from specray.cluster.serve.drafter_cli import add_drafter_parser

    add_serve_parser(sub)
    add_drafter_parser(sub)
    add_bench_parser(sub)
    from specray.cluster.distill.cli import add_distill_parser

    add_distill_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own usage, not the top level's list of commands
        parser.commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except ValueError as e:  # bad input: a clear message, no traceback
        print(f"specray {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
