"""`specray distill --kind eagle`: a feature-level draft (cluster/distill/eagle_model.py) instead of a
standalone one. Same data phase; then:

2. features: each shard's sequences run once through the target (transformers, fp32), its final
   hidden states cached per shard in OUT/features (resumable);
3. train (cluster/distill/eagle_train.py; checkpoints in OUT/eagle_checkpoint.pt, a re-run resumes); 4. save OUT/draft (fc and one layer, fp16, no embedding: the
   target's is used); 5. evaluate: greedy speculation on held-out prompts, checked lossless.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from specray.cluster.distill.data import load_samples
from specray.cluster.distill.eagle_model import init_eagle, load_eagle_draft, save_eagle
from specray.cluster.distill.eagle_train import EagleTrainConfig, FeatureSeq, evaluate, extract_features, train_eagle
from specray.cluster.distill.model import target_head


def feature_cache(out: Path, shard: Path) -> Path:
    """Where a shard's target features live: keyed by the shard's resolved path."""
    key = hashlib.sha1(str(Path(shard).resolve()).encode()).hexdigest()[:10]
    return out / "features" / f"{key}-{Path(shard).stem}.pt"


def shard_features(target_hf, out: Path, shards: list[Path], log) -> list[FeatureSeq]:
    seqs = []
    for i, shard in enumerate(shards):
        path = feature_cache(out, shard)
        if not path.exists():
            log(f"specray distill: target features for {shard} ({i + 1}/{len(shards)})")
            rows = extract_features(target_hf, load_samples([shard]), progress=False)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save([{"token_ids": s.token_ids, "features": s.features} for s in rows], path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
        seqs += [FeatureSeq(**d) for d in torch.load(path, weights_only=False)]
    return seqs


def distill_eagle(args, checkpoint, shards: list[Path], eval_ids: list[list[int]], eos: list[int], log,
                  acceptance_eval) -> int:
    from specray.cluster.bench.hf_baselines import load_hf
    from specray.kernels.loader import _read_safetensors

    wall = time.perf_counter()
    out = Path(args.out)
    draft = None
    if args.init_from:  # continue an earlier draft (its shape wins)
        draft = load_eagle_draft(args.init_from, checkpoint.hf_config())
        log(f"specray distill: starting from the draft in {args.init_from}")
    target_hf = load_hf(checkpoint.path).eval()
    seqs = shard_features(target_hf, out, shards, log)
    del target_hf
    if len(seqs) < 2:
        raise ValueError("eagle training needs at least two sequences")
    num_val = max(1, len(seqs) // 20)
    val, train_set = seqs[:num_val], seqs[num_val:]
    state = _read_safetensors(checkpoint.path)
    th = target_head(state, load_samples(shards), eos, args.vocab_trim_k or args.train_vocab_k or 8192)
    embed, head_full, head, table, k = th.embed, th.head_full, th.head, th.table, th.k
    rms = float(torch.cat([s.features[:64].float() for s in train_set[:64]]).pow(2).mean().sqrt())
    if draft is None:
        draft = init_eagle(state, checkpoint.hf_config(), feature_rms=rms)
    cfg = EagleTrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_len=args.max_len,
                           seed=args.seed, max_seconds=args.max_train_seconds,
                           checkpoint_every=args.checkpoint_every)
    before = evaluate(draft, val, embed, head_full, cfg)
    log(f"specray distill: held-out before training: {before}")
    summary = train_eagle(draft, train_set, embed, head, cfg, out / "eagle_checkpoint.pt", log=log)
    after = evaluate(draft, val, embed, head_full, cfg)
    log(f"specray distill: held-out after training: {after}")
    info = {
        "kind": "eagle", "target": args.model,
        "command": shlex.join(["specray", *sys.argv[1:]]) if Path(sys.argv[0]).name == "specray" else None,
        "args": {a: v for a, v in vars(args).items() if a != "func"},
        "num_sequences": len(seqs), "num_tokens": int(sum(len(s.token_ids) for s in seqs)),
        "train": {**vars(cfg), **summary}, "held_out_before": before, "held_out_after": after,
        "vocab_trim_k": k, "feature_rms": rms,
    }
    draft_dir = out / "draft"
    save_eagle(draft, draft_dir, args.model, checkpoint.path, vocab_trim=table, info=info)
    log(f"specray distill: wrote {draft_dir}")
    if eval_ids and args.eval_k and args.eval_k != [0]:
        info["eval"] = acceptance_eval(args.model, draft_dir, eval_ids, args.eval_k, [k], args.eval_max_tokens,
                                       args.device, method="eagle")
    info["wall_seconds"] = round(time.perf_counter() - wall, 1)
    (draft_dir / "eagle.json").write_text(json.dumps(info, indent=2))
    log(f"specray distill: done in {info['wall_seconds']:.0f}s; {draft_dir / 'eagle.json'}")
    return 0
