"""`specray distill`: train a small draft model for a target, for speculative decoding.

Phases, each resumable (re-run the same command to continue):
1. data: the target answers seed prompts (`distill_data`); its top-k distributions come back with
   the tokens, written in shards to OUT/data;
2. draft: a `LlamaForCausalLM` with the target's tokenizer, a smaller hidden size and a few layers,
   initialised from the target (`distill_model.init_draft`); `--kind eagle` instead trains a
   feature-level draft (cluster/distill/eagle.py);
3. train: KL to the target's distributions (`distill_train`), checkpoints in OUT/checkpoint.pt;
4. save: OUT/draft, an HF folder (fp16 by default) with the VocabTrim table and distill.json;
5. evaluate: held-out prompts (never trained on), greedy speculation through specray: acceptance
   length per num_speculative_tokens, VocabTrim on and off, and a greedy losslessness check.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import torch

from specray.cluster.distill.data import chat_ids, generate_shards, generate_shards_hf, load_samples
from specray.cluster.distill.self_prompts import all_prompts
from specray.cluster.distill.model import (init_draft, save_draft, park_untrained_rows, vocab_trim_counts,
                                           vocab_trim_table)
from specray.cluster.distill.train import TrainConfig, evaluate, final_hidden, train


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def extra_shards(folder: Path) -> list[Path]:
    shards = sorted(folder.glob("shard-*.pt"))
    if not shards:
        raise ValueError(f"--extra-data {folder}: no shard-*.pt files there")
    return shards


def build_draft(args, checkpoint):
    if args.init_from:  # continue training an earlier draft (its shape wins over the shape flags)
        return load_draft(args.init_from, checkpoint)
    from safetensors.torch import load_file

    state = {}
    for f in sorted(checkpoint.path.glob("*.safetensors")):
        state.update(load_file(str(f)))
    source = [int(x) for x in args.source_layers.split(",")] if args.source_layers else None
    return init_draft(state, checkpoint.hf_config(), args.hidden_size, args.num_layers, args.intermediate_size,
                      source)


def load_draft(name: str, target):
    """An earlier draft (alias or HF folder) as an fp32 `LlamaForCausalLM`; it must share the target's
    vocabulary, or its distributions cannot be compared with the target's."""
    from transformers import LlamaForCausalLM

    from specray.kernels.loader import resolve

    folder = resolve(name).path
    draft = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if draft.config.vocab_size != target.hf_config().vocab_size:
        raise ValueError(f"--init-from {name}: vocabulary {draft.config.vocab_size} differs from the target's "
                         f"{target.hf_config().vocab_size}")
    _log(f"specray distill: starting from the draft in {folder} (the shape flags are ignored)")
    return draft


def acceptance_eval(target: str, draft_dir: Path, prompts: list[list[int]], ks: list[int], vocab_trims: list[int],
                    max_tokens: int, device: str, method: str = "draft_model") -> dict:
    """Greedy speculation on held-out prompts: acceptance length per k and VocabTrim setting, and
    whether every output equals the target's own greedy output (lossless)."""
    from specray import LLM, SamplingParams

    results: dict = {"num_prompts": len(prompts), "max_tokens": max_tokens, "runs": []}
    base_llm = LLM(target, device=device, max_num_seqs=len(prompts))
    plain = base_llm.generate([{"prompt_token_ids": p} for p in prompts],
                              SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    want = [o.outputs[0].token_ids for o in plain]
    del base_llm
    lossless = True
    for trim in vocab_trims:
        llm = LLM(target, device=device, max_num_seqs=len(prompts),
                  speculative_config={"method": method, "model": str(draft_dir), "num_speculative_tokens": max(ks),
                                      "draft_vocab_trim": trim})
        for k in ks:
            sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, num_speculative_tokens=k)
            outs = [llm.generate({"prompt_token_ids": p}, sp)[0] for p in prompts]  # batch 1
            rounds = sum(o.metrics.num_rounds for o in outs)
            emitted = sum(o.metrics.num_emitted_tokens for o in outs)
            same = all(o.outputs[0].token_ids == w for o, w in zip(outs, want, strict=True))
            lossless &= same
            results["runs"].append({"vocab_trim": trim, "num_speculative_tokens": k,
                                    "acceptance_length": round(emitted / max(rounds, 1), 3),
                                    "greedy_equals_target": same})
            _log(f"specray distill: eval vocab_trim={trim} k={k}: acceptance length "
                 f"{results['runs'][-1]['acceptance_length']:.2f}{'' if same else ' (OUTPUT DIFFERS)'}")
    results["lossless"] = lossless
    return results


def check_init_from(args, checkpoint) -> None:
    """A --init-from draft of the wrong kind or shape fails before the data phase, not after it."""
    from transformers import AutoConfig

    from specray.cluster.distill.eagle_model import load_eagle_draft
    from specray.kernels.loader import resolve

    if args.kind == "eagle":
        load_eagle_draft(args.init_from, checkpoint.hf_config())
    elif AutoConfig.from_pretrained(resolve(args.init_from).path).vocab_size != checkpoint.hf_config().vocab_size:
        load_draft(args.init_from, checkpoint)  # raises, naming both vocabularies


def cmd_distill(args) -> int:
    from tqdm import tqdm

    from specray import LLM
    from specray.kernels.loader import resolve

    wall = time.perf_counter()
    if args.self_prompts is not None and min(args.self_prompts, args.self_prompt_max_tokens) <= 0:
        raise ValueError(f"--self-prompts must be positive, got {args.self_prompts} prompts of at most "
                         f"{args.self_prompt_max_tokens} tokens")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = resolve(args.model)
    extra = [p for folder in args.extra_data for p in extra_shards(Path(folder))]  # checked before the slow part
    if args.init_from:
        check_init_from(args, checkpoint)
    llm = None
    if args.data_backend == "specray" or args.self_prompts:
        llm = LLM(args.model, device=args.device, max_num_seqs=args.gen_batch_size,
                  kv_cache_tokens=args.gen_batch_size * (args.max_len + 64))
    prompts = all_prompts(args, llm, out)
    # held-out prompts: the last ones of the shuffled list, whatever --num-prompts says
    num_eval = max(1, min(args.eval_prompts, len(prompts) // 5)) if args.eval_prompts else 0
    train_prompts, eval_prompts = prompts[:len(prompts) - num_eval], prompts[len(prompts) - num_eval:]
    if args.num_prompts:
        train_prompts = train_prompts[:args.num_prompts]
    if not train_prompts:
        raise ValueError("no prompts left to train on; raise --num-prompts")

    # 1. data
    data_dir = Path(args.data) if args.data else out / "data"
    t0 = time.perf_counter()
    tok = checkpoint.tokenizer()
    config_eos = checkpoint.hf_config().eos_token_id
    eos = [t for t in [*(config_eos if isinstance(config_eos, list) else [config_eos]), tok.eos_token_id]
           if isinstance(t, int)]
    eos = list(dict.fromkeys(eos))
    bar = tqdm(total=len(train_prompts), desc="distill (target responses)", mininterval=5)
    if args.data_backend == "hf":  # transformers generate: the fast path on a GPU
        from specray.cluster.bench.hf_baselines import load_hf

        llm = None  # the engine wrote the self-written prompts; one copy of the target at a time
        hf = load_hf(checkpoint.path).to(args.device)
        shards = generate_shards_hf(hf, tok, train_prompts, data_dir, args.gen_batch_size, args.max_tokens,
                                    args.teacher_top_k, eos, args.temperature, progress=bar)
        del hf
    else:
        shards = generate_shards(llm, train_prompts, data_dir, args.gen_batch_size, args.max_tokens,
                                 args.teacher_top_k, args.temperature, progress=bar)
    del llm
    bar.close()
    if args.data_only:  # e.g. generate here, train elsewhere with --extra-data
        _log(f"specray distill: {len(shards)} shards in {data_dir} ({time.perf_counter() - t0:.0f}s); --data-only")
        return 0
    eval_ids = [chat_ids(tok, p) for p in eval_prompts]
    if args.kind == "eagle":
        from specray.cluster.distill.eagle import distill_eagle

        return distill_eagle(args, checkpoint, shards + extra, eval_ids, eos, _log, acceptance_eval)
    samples = load_samples(shards + extra)  # held-out rows come from this run's own shards first
    data_seconds = time.perf_counter() - t0
    num_val = max(1, len(samples) // 20) if len(samples) >= 2 else 0
    val, train_set = samples[:num_val], samples[num_val:] or samples
    _log(f"specray distill: {len(samples)} responses, {sum(len(s.response_ids) for s in samples)} tokens "
         f"({data_seconds:.0f}s)")

    # 2. draft, 3. train
    draft = build_draft(args, checkpoint)
    table = vocab_trim_table(vocab_trim_counts(samples, draft.config.vocab_size), eos)
    train_vocab = table["token_ids"][:args.train_vocab_k] if args.train_vocab_k else None
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_len=args.max_len,
                      checkpoint_every=args.checkpoint_every, seed=args.seed, device=args.device,
                      autocast=args.autocast, max_seconds=args.max_train_seconds, vocab=train_vocab)
    before = evaluate(draft.to(args.device), val, cfg) if val else {}
    _log(f"specray distill: held-out before training: {before}")
    summary = train(draft, train_set, cfg, out / "checkpoint.pt", log=_log)
    after = evaluate(draft, val, cfg) if val else {}
    _log(f"specray distill: held-out after training: {after}")
    shrink = None
    if train_vocab is not None and val:
        shrink = park_untrained_rows(draft, train_vocab.long(), final_hidden(draft, val, cfg))
        _log(f"specray distill: rows outside the trained vocabulary parked for full-vocabulary users: {shrink}")

    # 4. save
    k = min(args.vocab_trim_k, int(table["token_ids"].numel())) if args.vocab_trim_k else 0
    info = {
        "target": args.model,
        "command": shlex.join(["specray", *sys.argv[1:]]) if Path(sys.argv[0]).name == "specray" else None,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "prompts": str(args.prompts or ("" if args.self_prompts else "specray/cluster/distill/data/distill_prompts.json")),
        "self_prompts": str(out / "self_prompts.jsonl") if args.self_prompts else None,
        "num_train_prompts": len(train_prompts), "num_eval_prompts": len(eval_prompts),
        "num_responses": len(samples), "num_response_tokens": sum(len(s.response_ids) for s in samples),
        "teacher_top_k": args.teacher_top_k, "temperature": args.temperature,
        "draft": {"hidden_size": draft.config.hidden_size, "num_layers": draft.config.num_hidden_layers,
                  "intermediate_size": draft.config.intermediate_size, "init_from": args.init_from},
        "train": {**{k: v for k, v in vars(cfg).items() if k != "vocab"}, **summary,
                  "train_vocab_k": args.train_vocab_k, "untrained_rows": shrink}, "held_out_before": before, "held_out_after": after,
        "vocab_trim_k": k, "vocab_trim_table_size": int(table["token_ids"].numel()),
        "vocab_trim_mass_at_k": (float(table["counts"][:k].sum() / table["counts"].sum()) if k else None),
        "data_seconds": round(data_seconds, 1), "device": args.device,
    }
    draft_dir = out / "draft"
    save_draft(draft.cpu(), draft_dir, checkpoint.path, getattr(torch, args.save_dtype), table, info)
    _log(f"specray distill: wrote {draft_dir}")

    # 5. evaluate
    if eval_ids and args.eval_k and args.eval_k != [0]:
        trims = sorted({0, k})
        info["eval"] = acceptance_eval(args.model, draft_dir, eval_ids, args.eval_k, trims, args.eval_max_tokens,
                                       args.device)
    info["wall_seconds"] = round(time.perf_counter() - wall, 1)
    (draft_dir / "distill.json").write_text(json.dumps(info, indent=2))
    _log(f"specray distill: done in {info['wall_seconds']:.0f}s; {draft_dir / 'distill.json'}")
    return 0


def add_distill_parser(sub) -> None:
    def int_list(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    p = sub.add_parser("distill", help="train a small draft model for a target (KL to its own responses)")
    p.add_argument("--model", default="smollm2-135m", help="target: alias, HF folder or .gguf file")
    p.add_argument("--out", required=True, help="run folder: data, checkpoint.pt and the draft (OUT/draft)")
    d = p.add_argument_group("data")
    d.add_argument("--prompts", default=None, help="seed file: JSON {topics, templates} or JSONL {'prompt'} "
                   "(default: the packaged distill_prompts.json)")
    d.add_argument("--self-prompts", type=int, default=None, metavar="N",
                   help="the target writes N prompts itself, sampled from its chat template's user turn "
                        "(OUT/self_prompts.jsonl); with --prompts, both sets are used")
    d.add_argument("--self-prompt-max-tokens", type=int, default=64,
                   help="longest self-written prompt; a user turn not closed by then is dropped")
    d.add_argument("--data", default=None, help="shard folder (default OUT/data); reused and extended")
    d.add_argument("--num-prompts", type=int, default=None, help="use the first N shuffled prompts")
    d.add_argument("--extra-data", action="append", default=[], metavar="DIR",
                   help="also train on this shard folder (e.g. an earlier run's OUT/data); repeatable")
    d.add_argument("--max-tokens", type=int, default=160, help="response tokens per prompt")
    d.add_argument("--teacher-top-k", type=int, default=32, help="target log-probs kept per token")
    d.add_argument("--temperature", type=float, default=0.0, help="target sampling temperature for responses")
    d.add_argument("--gen-batch-size", type=int, default=64, help="prompts per shard and engine batch")
    d.add_argument("--data-backend", default="specray", choices=["specray", "hf"],
                   help="who generates: the specray engine, or transformers generate (fast on a GPU)")
    d.add_argument("--data-only", action="store_true",
                   help="stop after writing the shards (no draft, no training)")
    m = p.add_argument_group("draft")
    m.add_argument("--kind", default="model", choices=["model", "eagle"],
                   help="model: a standalone Llama draft; eagle: a feature-level draft reading the target's "
                        "hidden states (serve it with method 'eagle')")
    m.add_argument("--hidden-size", type=int, default=256)
    m.add_argument("--num-layers", type=int, default=3)
    m.add_argument("--intermediate-size", type=int, default=None, help="default: the target's")
    m.add_argument("--source-layers", default=None, help="target layers to start from, e.g. 0,15,29 "
                   "(default: evenly spaced)")
    m.add_argument("--init-from", default=None,
                   help="start from an earlier draft (alias or HF folder) instead of the target's layers")
    m.add_argument("--vocab-trim-k", type=int, default=8192, help="recommended VocabTrim size (0: none)")
    m.add_argument("--train-vocab-k", type=int, default=0,
                   help="train the head on the k most frequent tokens only (VocabTrim-aware; cheap on CPU); "
                        "0: the full vocabulary")
    m.add_argument("--save-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=float, default=2.0)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--max-len", type=int, default=512)
    t.add_argument("--checkpoint-every", type=int, default=100)
    t.add_argument("--max-train-seconds", type=float, default=None, help="stop training early after this long")
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    t.add_argument("--autocast", default="auto", choices=["auto", "bf16", "none"])
    t.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group("evaluation")
    e.add_argument("--eval-prompts", type=int, default=16, help="held-out seed prompts (never trained on)")
    e.add_argument("--eval-max-tokens", type=int, default=64)
    e.add_argument("--eval-k", type=int_list, default=[2, 3, 4],
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
