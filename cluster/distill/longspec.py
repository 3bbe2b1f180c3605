"""`specray distill --kind longspec`: a LongSpec draft (kernels/drafters/longspec_model.py). Same
data phase; then:

2. target KV: each shard's sequences run once through the target at anchor-offset positions, its
   last-layer KV and final hidden states cached per shard in OUT/longspec_kv (resumable);
3. train (cluster/distill/longspec_train.py; checkpoints in OUT/longspec_checkpoint.pt, a re-run
   resumes); 4. save OUT/draft (one layer, fp16, no embedding or head: the target's are used);
5. evaluate: greedy speculation on held-out prompts, checked lossless.
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
import sys
import time
from pathlib import Path

import torch

from specray.cluster.distill.data import load_samples
from specray.cluster.distill.longspec_train import (
    KVSeq,
    LongSpecTrainConfig,
    evaluate,
    extract_target_kv,
    init_longspec,
    step_loss,
)
from specray.cluster.distill.model import target_head, write_draft_folder
from specray.kernels.drafters.longspec_folder import LONGSPEC_FILE
from specray.kernels.drafters.longspec_model import LongSpecLayer


def kv_cache_path(out: Path, shard: Path) -> Path:
    key = hashlib.sha1(str(Path(shard).resolve()).encode()).hexdigest()[:10]
    return out / "longspec_kv" / f"{key}-{Path(shard).stem}.pt"


def shard_target_kv(target_hf, out: Path, shards: list[Path], cfg: LongSpecTrainConfig, log) -> list[KVSeq]:
    seqs = []
    for i, shard in enumerate(shards):
        path = kv_cache_path(out, shard)
        if not path.exists():
            log(f"specray distill: target KV for {shard} ({i + 1}/{len(shards)})")
            rows = extract_target_kv(target_hf, load_samples([shard]), cfg, seed=cfg.seed + i, progress=False)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save([vars(s) for s in rows], path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
        seqs += [KVSeq(**d) for d in torch.load(path, weights_only=False)]
    return seqs


def train_longspec(layer: LongSpecLayer, seqs: list[KVSeq], embed: torch.Tensor, head: torch.Tensor,
                   cfg: LongSpecTrainConfig, checkpoint: Path | None = None, progress=True, log=print) -> dict:
    """Train in place (cluster/distill/train.py `run_training`) -> summary; resumes from `checkpoint`."""
    from specray.cluster.distill.train import run_training

    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].token_ids))  # batches of like lengths
    batches = [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]

    def loss_of(batch: list[int], step: int) -> torch.Tensor:
        rng = random.Random(cfg.seed * 1_000_003 + step)  # this step's lag
        return step_loss(layer, [seqs[i] for i in batch], embed, head, cfg, rng)

    return run_training(layer, list(layer.parameters()), batches, loss_of, cfg, checkpoint, "longspec (train steps)",
                        progress, log)


def save_longspec(layer: LongSpecLayer, folder: Path, target: str, hf_config: dict, tokenizer_from: Path,
                  vocab_trim: dict[str, torch.Tensor] | None = None, info: dict | None = None,
                  dtype: torch.dtype = torch.float16) -> Path:
    """Write config.json (the target's: its shapes), model.safetensors (the layer), longspec.json,
    tokenizer files and the VocabTrim table."""
    weights = {n: p.to(dtype) for n, p in layer.named_parameters()}
    marker = {LONGSPEC_FILE: json.dumps({"target": target, "window": layer.window, **(info or {})}, indent=2)}
    return write_draft_folder(folder, weights, hf_config, tokenizer_from, vocab_trim, marker)


def distill_longspec(args, checkpoint, shards: list[Path], eval_ids: list[list[int]], eos: list[int], log,
                     acceptance_eval) -> int:
    from specray.cluster.bench.hf_baselines import load_hf
    from specray.kernels.loader import _read_safetensors

    wall = time.perf_counter()
    out = Path(args.out)
    hf = checkpoint.hf_config()
    cfg = LongSpecTrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_len=args.max_len,
                              seed=args.seed, max_seconds=args.max_train_seconds,
                              checkpoint_every=args.checkpoint_every, position_limit=hf.max_position_embeddings)
    target_hf = load_hf(checkpoint.path).eval()
    seqs = shard_target_kv(target_hf, out, shards, cfg, log)
    del target_hf
    if len(seqs) < 2:
        raise ValueError("longspec training needs at least two sequences")
    random.Random(args.seed).shuffle(seqs)  # held-out rows from every shard, long and short
    num_val = max(1, len(seqs) // 20)
    val, train_set = seqs[:num_val], seqs[num_val:]
    state = _read_safetensors(checkpoint.path)
    th = target_head(state, load_samples(shards), eos, args.vocab_trim_k or args.train_vocab_k or 8192)
    layer = init_longspec(state, hf, args.window)
    if args.init_from:
        from specray.kernels.drafters.longspec_folder import load_longspec
        from specray.kernels.loader import resolve

        layer.load_state_dict(load_longspec(resolve(args.init_from).path, args.window)[0].state_dict())
        log(f"specray distill: starting from the LongSpec draft in {args.init_from}")
    before = evaluate(layer, val, th.embed, th.head_full, cfg)
    log(f"specray distill: held-out before training: {before}")
    summary = train_longspec(layer, train_set, th.embed, th.head, cfg, out / "longspec_checkpoint.pt", log=log)
    after = evaluate(layer, val, th.embed, th.head_full, cfg)
    log(f"specray distill: held-out after training: {after}")
    info = {
        "kind": "longspec",
        "command": shlex.join(["specray", *sys.argv[1:]]) if Path(sys.argv[0]).name == "specray" else None,
        "args": {a: v for a, v in vars(args).items() if a != "func"},
        "num_sequences": len(seqs), "num_tokens": int(sum(len(s.token_ids) for s in seqs)),
        "longest_sequence": int(max(len(s.token_ids) for s in seqs)),
        "train": {**vars(cfg), **summary}, "held_out_before": before, "held_out_after": after, "vocab_trim_k": th.k,
    }
    draft_dir = save_longspec(layer, out / "draft", args.model, hf.to_dict(), checkpoint.path, th.table, info)
    log(f"specray distill: wrote {draft_dir}")
    if eval_ids and args.eval_k and args.eval_k != [0]:
        info["eval"] = acceptance_eval(args.model, draft_dir, eval_ids, args.eval_k, [th.k], args.eval_max_tokens,
                                       args.device, method="longspec")
    info["wall_seconds"] = round(time.perf_counter() - wall, 1)
    (draft_dir / LONGSPEC_FILE).write_text(json.dumps({"target": args.model, "window": layer.window, **info}, indent=2))
    log(f"specray distill: done in {info['wall_seconds']:.0f}s; {draft_dir / LONGSPEC_FILE}")
    return 0
