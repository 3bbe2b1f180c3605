"""The phases of `specray distill` (cluster/distill/cli.py runs them in order): data, draft and
train, save, evaluate; plus the checks that run before the slow part."""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specray.cluster.distill.data import generate_shards, generate_shards_hf
from specray.cluster.distill.model import (
    init_draft,
    park_untrained_rows,
    save_draft,
    vocab_trim_counts,
    vocab_trim_table,
)
from specray.cluster.distill.self_prompts import all_prompts
from specray.cluster.distill.train import TrainConfig, evaluate, final_hidden, train
from specray.kernels.chat import prompt_token_ids

PACKAGED_PROMPTS = "specray/cluster/distill/data/distill_prompts.json"


def log(msg: str) -> None:
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
    from specray.kernels.loader import hf_llama, resolve

    folder = resolve(name).path
    draft = hf_llama(folder)
    if draft.config.vocab_size != target.hf_config().vocab_size:
        raise ValueError(f"--init-from {name}: vocabulary {draft.config.vocab_size} differs from the target's "
                         f"{target.hf_config().vocab_size}")
    log(f"specray distill: starting from the draft in {folder} (the shape flags are ignored)")
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
            log(f"specray distill: eval vocab_trim={trim} k={k}: acceptance length "
                 f"{results['runs'][-1]['acceptance_length']:.2f}{'' if same else ' (OUTPUT DIFFERS)'}")
    results["lossless"] = lossless
    return results


def check_init_from(args, checkpoint) -> None:
    """A --init-from draft of the wrong kind or shape fails before the data phase, not after it."""
    from specray.cluster.distill.eagle_model import load_eagle_draft
    from specray.kernels.loader import hf_config, resolve

    if args.kind == "eagle":
        load_eagle_draft(args.init_from, checkpoint.hf_config())
    elif args.kind == "longspec":
        from specray.kernels.config import ModelConfig
        from specray.kernels.drafters.longspec_folder import check_pairing

        config = ModelConfig.from_hf(checkpoint.hf_config())
        check_pairing(args.init_from, config, {"window": args.window}, config.max_position_embeddings)
    elif hf_config(resolve(args.init_from).path).vocab_size != checkpoint.hf_config().vocab_size:
        load_draft(args.init_from, checkpoint)  # raises, naming both vocabularies


@dataclass
class Setup:
    """What every phase reads: the run folder, the target, its EOS ids and the prompt split."""

    out: Path
    checkpoint: object  # kernels/loader.py Checkpoint
    tokenizer: object
    eos: list[int]
    train_prompts: list
    eval_prompts: list
    extra: list[Path]  # shards of earlier runs (--extra-data)
    data_dir: Path  # this run's shards (--data, else OUT/data)


def prepare(args, llm, extra: list[Path]) -> Setup:
    """Checks, the run folder and the prompt split; held-out prompts are the last of the shuffled list."""
    from specray.kernels.loader import resolve

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = resolve(args.model)
    prompts = all_prompts(args, llm, out)
    num_eval = max(1, min(args.eval_prompts, len(prompts) // 5)) if args.eval_prompts else 0
    train_prompts, eval_prompts = prompts[:len(prompts) - num_eval], prompts[len(prompts) - num_eval:]
    if args.num_prompts:
        train_prompts = train_prompts[:args.num_prompts]
    if not train_prompts:
        raise ValueError("no prompts left to train on; raise --num-prompts")
    tok = checkpoint.tokenizer()
    config_eos = checkpoint.hf_config().eos_token_id
    eos = [t for t in [*(config_eos if isinstance(config_eos, list) else [config_eos]), tok.eos_token_id]
           if isinstance(t, int)]
    data_dir = Path(args.data) if args.data else out / "data"
    return Setup(out, checkpoint, tok, list(dict.fromkeys(eos)), train_prompts, eval_prompts, extra, data_dir)


def check_args(args) -> list[Path]:
    """Mistakes that would otherwise surface after the slow data phase; returns the --extra-data shards."""
    from specray.kernels.loader import resolve

    from specray.cluster.params import MAX_LOGPROBS

    if not 1 <= args.teacher_top_k <= MAX_LOGPROBS:
        raise ValueError(f"--teacher-top-k must be in [1, {MAX_LOGPROBS}] (the engine returns at most "
                         f"{MAX_LOGPROBS} logprobs a token), got {args.teacher_top_k}")
    extra = [p for folder in args.extra_data for p in extra_shards(Path(folder))]
    if args.kind == "longspec":
        limit = resolve(args.model).hf_config().max_position_embeddings
        if not 1 <= args.window <= limit:
            raise ValueError(f"--window must be in [1, {limit}] (the target's context), got {args.window}")
    if args.init_from and args.kind != "diffusion":  # a DLLM checks its own start (distill/diffusion.py)
        check_init_from(args, resolve(args.model))
    return extra


def data_phase(args, setup: Setup, llm) -> list[Path]:
    """1. The target's responses to the training prompts, with its top-k distributions, in shards."""
    from tqdm import tqdm

    data_dir = setup.data_dir
    bar = tqdm(total=len(setup.train_prompts), desc="distill (target responses)", mininterval=5)
    if args.data_backend == "hf":  # transformers generate: the fast path on a GPU
        from specray.cluster.bench.hf_baselines import load_hf

        hf = load_hf(setup.checkpoint.path).to(args.device)
        shards = generate_shards_hf(hf, setup.tokenizer, setup.train_prompts, data_dir, args.gen_batch_size,
                                    args.max_tokens, args.teacher_top_k, setup.eos, args.temperature, progress=bar)
    else:
        shards = generate_shards(llm, setup.train_prompts, data_dir, args.gen_batch_size, args.max_tokens,
                                 args.teacher_top_k, args.temperature, progress=bar)
    bar.close()
    return shards


def train_phase(args, setup: Setup, samples: list) -> tuple:
    """2. The draft (initialised from the target, or --init-from), 3. KL training on the samples."""
    num_val = max(1, len(samples) // 20) if len(samples) >= 2 else 0
    val, train_set = samples[:num_val], samples[num_val:] or samples
    draft = build_draft(args, setup.checkpoint)
    table = vocab_trim_table(vocab_trim_counts(samples, draft.config.vocab_size), setup.eos)
    train_vocab = table["token_ids"][:args.train_vocab_k] if args.train_vocab_k else None
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_len=args.max_len,
                      checkpoint_every=args.checkpoint_every, seed=args.seed, device=args.device,
                      autocast=args.autocast, max_seconds=args.max_train_seconds, vocab=train_vocab)
    before = evaluate(draft.to(args.device), val, cfg) if val else {}
    log(f"specray distill: held-out before training: {before}")
    summary = train(draft, train_set, cfg, setup.out / "checkpoint.pt", log=log)
    after = evaluate(draft, val, cfg) if val else {}
    log(f"specray distill: held-out after training: {after}")
    shrink = None
    if train_vocab is not None and val:
        shrink = park_untrained_rows(draft, train_vocab.long(), final_hidden(draft, val, cfg))
        log(f"specray distill: rows outside the trained vocabulary parked for full-vocabulary users: {shrink}")
    trained = {**{k: v for k, v in vars(cfg).items() if k != "vocab"}, **summary,
               "train_vocab_k": args.train_vocab_k, "untrained_rows": shrink}
    return draft, table, {"train": trained, "held_out_before": before, "held_out_after": after}


def save_phase(args, setup: Setup, samples: list, draft, table, trained: dict, data_seconds: float) -> tuple:
    """4. OUT/draft: an HF folder with the VocabTrim table and distill.json; returns it and the info."""
    k = min(args.vocab_trim_k, int(table["token_ids"].numel())) if args.vocab_trim_k else 0
    info = {
        "target": args.model,
        "command": shlex.join(["specray", *sys.argv[1:]]) if Path(sys.argv[0]).name == "specray" else None,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "prompts": str(args.prompts or ("" if args.self_prompts else PACKAGED_PROMPTS)),
        "self_prompts": str(setup.out / "self_prompts.jsonl") if args.self_prompts else None,
        "num_train_prompts": len(setup.train_prompts), "num_eval_prompts": len(setup.eval_prompts),
        "num_responses": len(samples), "num_response_tokens": sum(len(s.response_ids) for s in samples),
        "teacher_top_k": args.teacher_top_k, "temperature": args.temperature,
        "draft": {"hidden_size": draft.config.hidden_size, "num_layers": draft.config.num_hidden_layers,
                  "intermediate_size": draft.config.intermediate_size, "init_from": args.init_from},
        **trained,
        "vocab_trim_k": k, "vocab_trim_table_size": int(table["token_ids"].numel()),
        "vocab_trim_mass_at_k": (float(table["counts"][:k].sum() / table["counts"].sum()) if k else None),
        "data_seconds": round(data_seconds, 1), "device": args.device,
    }
    draft_dir = setup.out / "draft"
    save_draft(draft.cpu(), draft_dir, setup.checkpoint.path, getattr(torch, args.save_dtype), table, info)
    log(f"specray distill: wrote {draft_dir}")
    return draft_dir, info


def eval_phase(args, setup: Setup, draft_dir: Path, info: dict, wall: float) -> None:
    """5. Greedy speculation on the held-out prompts; then distill.json is final."""
    eval_ids = [prompt_token_ids(setup.tokenizer, p) for p in setup.eval_prompts]
    if eval_ids and args.eval_k and args.eval_k != [0]:
        info["eval"] = acceptance_eval(args.model, draft_dir, eval_ids, args.eval_k, sorted({0, info["vocab_trim_k"]}),
                                       args.eval_max_tokens, args.device)
    info["wall_seconds"] = round(time.perf_counter() - wall, 1)
    (draft_dir / "distill.json").write_text(json.dumps(info, indent=2))
    log(f"specray distill: done in {info['wall_seconds']:.0f}s; {draft_dir / 'distill.json'}")
