"""`specray distill`: train a small draft model for a target, for speculative decoding.

Phases, each resumable (re-run the same command to continue):
1. data: the target answers seed prompts (cluster/distill/data.py); its top-k distributions come back with
   the tokens, written in shards to OUT/data;
2. draft: a `LlamaForCausalLM` with the target's tokenizer, a smaller hidden size and a few layers,
   initialised from the target (`distill_model.init_draft`); `--kind eagle` instead trains a
   feature-level draft (cluster/distill/eagle.py), `--kind longspec` a LongSpec draft
   (cluster/distill/longspec.py);
3. train: KL to the target's distributions (`distill_train`), checkpoints in OUT/checkpoint.pt;
4. save: OUT/draft, an HF folder (fp16 by default) with the VocabTrim table and distill.json;
5. evaluate: held-out prompts (never trained on), greedy speculation through specray: acceptance
   length per num_speculative_tokens, VocabTrim on and off, and a greedy losslessness check.
"""

from __future__ import annotations

import sys
import time

import torch

from specray.cluster.args import (
    non_negative_float,
    non_negative_int,
    non_negative_int_list,
    out_folder,
    positive_float,
    positive_int,
)
from specray.cluster.distill.data import load_samples
from specray.cluster.distill.phases import (
    acceptance_eval,
    check_args,
    data_phase,
    eval_phase,
    log,
    prepare,
    save_phase,
    train_phase,
)
from specray.kernels.chat import prompt_token_ids


def cmd_distill(args) -> int:
    from specray import LLM

    wall = time.perf_counter()
    extra = check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    llm = None
    if args.data_backend == "specray" or args.self_prompts:
        llm = LLM(args.model, device=args.device, max_num_seqs=args.gen_batch_size,
                  kv_cache_tokens=args.gen_batch_size * (args.max_len + 64))
    setup = prepare(args, llm, extra)
    t0 = time.perf_counter()
    if args.data_backend == "hf":
        llm = None  # the router wrote the self-written prompts; one copy of the target at a time
    shards = data_phase(args, setup, llm)
    del llm
    if args.data_only:  # e.g. generate here, train elsewhere with --extra-data
        log(f"specray distill: {len(shards)} shards in {setup.data_dir} ({time.perf_counter() - t0:.0f}s); --data-only")
        return 0
    if args.kind == "diffusion":
        from specray.cluster.distill.diffusion import distill_diffusion

        return distill_diffusion(args, setup, shards + setup.extra, log)
    if args.kind in ("eagle", "longspec"):
        from specray.cluster.distill.eagle import distill_eagle
        from specray.cluster.distill.longspec import distill_longspec

        eval_ids = [prompt_token_ids(setup.tokenizer, p) for p in setup.eval_prompts]
        run = distill_eagle if args.kind == "eagle" else distill_longspec
        return run(args, setup.checkpoint, shards + setup.extra, eval_ids, setup.eos, log, acceptance_eval)
    samples = load_samples(shards + setup.extra)  # held-out rows come from this run's own shards first
    data_seconds = time.perf_counter() - t0
    log(f"specray distill: {len(samples)} responses, {sum(len(s.response_ids) for s in samples)} tokens "
         f"({data_seconds:.0f}s)")
    draft, table, trained = train_phase(args, setup, samples)
    draft_dir, info = save_phase(args, setup, samples, draft, table, trained, data_seconds)
    eval_phase(args, setup, draft_dir, info, wall)
    return 0


def add_distill_parser(sub) -> None:
    p = sub.add_parser("distill", help="train a small draft model for a target (KL to its own responses)")
    p.add_argument("--model", default="smollm2-135m", help="target: alias, HF folder or .gguf file")
    p.add_argument("--out", type=out_folder, required=True, help="run folder: data, checkpoint.pt and the draft (OUT/draft)")
    d = p.add_argument_group("data")
    d.add_argument("--prompts", default=None, help="seed file: JSON {topics, templates} or JSONL {'prompt'} "
                   "(default: the packaged distill_prompts.json)")
    d.add_argument("--self-prompts", type=positive_int, default=None, metavar="N",
                   help="the target writes N prompts itself, sampled from its chat template's user turn "
                        "(OUT/self_prompts.jsonl); with --prompts, both sets are used")
    d.add_argument("--self-prompt-max-tokens", type=positive_int, default=64,
                   help="longest self-written prompt; a user turn not closed by then is dropped")
    d.add_argument("--data", default=None, help="shard folder (default OUT/data); reused and extended")
    d.add_argument("--num-prompts", type=positive_int, default=None, help="use the first N shuffled prompts")
    d.add_argument("--extra-data", action="append", default=[], metavar="DIR",
                   help="also train on this shard folder (e.g. an earlier run's OUT/data); repeatable")
    d.add_argument("--max-tokens", type=positive_int, default=160, help="response tokens per prompt")
    d.add_argument("--teacher-top-k", type=positive_int, default=20,
                   help="target log-probs kept per token (at most 20, the engine's logprobs limit)")
    d.add_argument("--temperature", type=non_negative_float, default=0.0, help="target sampling temperature for responses")
    d.add_argument("--gen-batch-size", type=positive_int, default=64, help="prompts per shard and engine batch")
    d.add_argument("--data-backend", default="specray", choices=["specray", "hf"],
                   help="who generates: the specray engine, or transformers generate (fast on a GPU)")
    d.add_argument("--data-only", action="store_true",
                   help="stop after writing the shards (no draft, no training)")
    m = p.add_argument_group("draft")
    m.add_argument("--kind", default="model", choices=["model", "eagle", "longspec", "diffusion"],
                   help="model: a standalone Llama draft; eagle: a feature-level draft reading the target's "
                        "hidden states (serve it with method 'eagle'); longspec: one layer with a sliding "
                        "window cross-attending the target's last-layer KV (method 'longspec'); diffusion: a "
                        "diffusion LM that serves on its own (Dream layout, from --init-from, default the "
                        "packaged smollm2-135m-draft; trained to unmask the target's responses)")
    m.add_argument("--window", type=positive_int, default=512,
                   help="longspec: the draft's self-attention window (its constant-size ring buffer)")
    m.add_argument("--hidden-size", type=positive_int, default=256, help="the draft's hidden size (default 256)")
    m.add_argument("--num-layers", type=positive_int, default=3, help="the draft's decoder layers (default 3)")
    m.add_argument("--intermediate-size", type=positive_int, default=None, help="default: the target's")
    m.add_argument("--source-layers", default=None, help="target layers to start from, e.g. 0,15,29 "
                   "(default: evenly spaced)")
    m.add_argument("--init-from", default=None,
                   help="start from an earlier draft (alias or HF folder) instead of the target's layers")
    m.add_argument("--vocab-trim-k", type=non_negative_int, default=8192, help="recommended VocabTrim size (0: none)")
    m.add_argument("--train-vocab-k", type=non_negative_int, default=0,
                   help="train the head on the k most frequent tokens only (VocabTrim-aware; cheap on CPU); "
                        "0: the full vocabulary")
    m.add_argument("--save-dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="the written draft's weights (default float16)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=positive_float, default=2.0, help="passes over the data (default 2; fractions too)")
    t.add_argument("--batch-size", type=positive_int, default=16, help="sequences a training step (default 16)")
    t.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)")
    t.add_argument("--max-len", type=positive_int, default=512, help="tokens a training sequence at most (default 512)")
    t.add_argument("--checkpoint-every", type=positive_int, default=100,
                   help="steps between resumable checkpoints (default 100)")
    t.add_argument("--max-train-seconds", type=positive_float, default=None, help="stop training early after this long")
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to train (default: cuda when there is one, else cpu)")
    t.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    t.add_argument("--autocast", default="auto", choices=["auto", "bf16", "none"],
                   help="mixed precision: auto (bf16 on a GPU, fp32 on CPU), bf16 or none")
    t.add_argument("--seed", type=int, default=0, help="seed of the data order and initialisation (default 0)")
    e = p.add_argument_group("evaluation")
    e.add_argument("--eval-prompts", type=non_negative_int, default=16, help="held-out seed prompts (never trained on)")
    e.add_argument("--eval-max-tokens", type=positive_int, default=64,
                   help="tokens generated a held-out prompt in the evaluation (default 64)")
    e.add_argument("--eval-k", type=non_negative_int_list, default=[2, 3, 4],
                   help="num_speculative_tokens to evaluate (0: skip the speculation evaluation)")
    p.set_defaults(func=cmd_distill)


def main(argv: list[str] | None = None) -> int:
    """`python -m specray.cluster.distill ...`: the distill command alone (what a bare GPU box needs)."""
    import argparse

    parser = argparse.ArgumentParser(prog="specray")
    add_distill_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["distill", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
