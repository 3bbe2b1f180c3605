"""The training loop of `specray distill`: KL from the target's distribution to the draft's.

Loss per response token: KL(q || p) over the target's top-k tokens plus one bucket for the rest of
the vocabulary, with q the target (teacher) distribution and p the draft's softmax. Matching the
target's distribution, not the sampled token, is what raises acceptance: greedy verification
accepts when argmax p = argmax q, speculative sampling accepts with probability
sum_x min(p(x), q(x)) = 1 - TV(p, q). Checkpoints (weights, optimiser, step, data order) are
written every `checkpoint_every` steps and a run resumes from the last one.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specray.cluster.distill.data import Sample


@dataclass
class ScheduleConfig:
    """What every draft training run shares: how long, how big a step, and the LR schedule."""

    epochs: float = 2.0
    batch_size: int = 16  # sequences per step
    lr: float = 1e-3
    warmup_steps: int = 30
    max_len: int = 512  # prompt + response tokens kept per sequence
    checkpoint_every: int = 100
    seed: int = 0
    max_seconds: float | None = None  # stop early (with a checkpoint) after this much training time


def warmup_cosine(opt, cfg: ScheduleConfig, total: int):
    """Linear warmup over `warmup_steps`, then cosine from lr down to lr / 10 at step `total`."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0)))))


@dataclass
class TrainConfig(ScheduleConfig):
    weight_decay: float = 0.0
    device: str = "cpu"
    autocast: str = "auto"  # "bf16" | "none" | "auto": bf16 on CUDA (on CPU, even with AMX, fp32 measured faster)
    # Train the head on these token ids only (a VocabTrim subset, [k]): the head costs k/vocab_size
    # of a full one, which is what makes CPU training affordable. None: the full vocabulary.
    vocab: torch.Tensor | None = None


def _use_bf16(cfg: TrainConfig) -> bool:
    if cfg.autocast != "auto":
        return cfg.autocast == "bf16"
    return cfg.device.startswith("cuda")


def kl_topk(draft_logits: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor,
            column: torch.Tensor | None = None) -> torch.Tensor:
    """Mean KL(q || p) over rows; q given by its top-k (plus the remaining mass as one bucket).

    draft_logits [rows, num_columns]; top_ids [rows, top_k] token ids; top_logprobs [rows, top_k];
    column [vocab_size]: token id -> logits column, -1 for tokens the (trimmed) draft lacks, whose
    target mass joins the remaining bucket. None: columns are token ids.
    """
    logp = draft_logits.float().log_softmax(-1)  # [rows, num_columns]
    pos = top_ids.long() if column is None else column[top_ids.long()]  # [rows, top_k]
    inside = pos >= 0
    logp_top = logp.gather(1, pos.clamp_min(0))  # [rows, top_k]
    logq_top = top_logprobs.float()
    q_top = logq_top.exp() * inside
    q_rest = (1.0 - q_top.sum(-1)).clamp_min(0.0)  # [rows]
    p_rest = (1.0 - (logp_top.exp() * inside).sum(-1)).clamp_min(1e-6)
    kl = (q_top * (logq_top - logp_top)).sum(-1)
    kl = kl + q_rest * (q_rest.clamp_min(1e-6).log() - p_rest.log())
    return kl.mean()


def _batch(samples: list[Sample], max_len: int, device: str):
    """Right-padded ids and, for each response token, the flat index of the position predicting it."""
    seqs, rows, ids, lps = [], [], [], []
    width = 0
    for s in samples:
        seq = (s.prompt_ids + s.response_ids)[:max_len]
        n_resp = len(seq) - len(s.prompt_ids)
        if n_resp <= 0:
            continue
        seqs.append(seq)
        width = max(width, len(seq))
        ids.append(s.top_ids[:n_resp])
        lps.append(s.top_logprobs[:n_resp])
    input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for b, seq in enumerate(seqs):
        input_ids[b, :len(seq)] = torch.tensor(seq)
        mask[b, :len(seq)] = 1
        start = len(seq) - ids[b].shape[0] - 1  # the position before response token 0
        rows.append(torch.arange(start, start + ids[b].shape[0]) + b * width)
    return (input_ids.to(device), mask.to(device), torch.cat(rows).to(device),
            torch.cat(ids).to(device), torch.cat(lps).to(device))


def draft_logits_at(draft, input_ids, mask, rows, vocab: torch.Tensor | None = None) -> torch.Tensor:
    """The draft's logits at the flat positions `rows` only (the head is the expensive part), over
    `vocab` [k] token ids when given."""
    hidden = draft.model(input_ids=input_ids, attention_mask=mask).last_hidden_state  # [B, L, hidden]
    h = hidden.flatten(0, 1)[rows]
    if vocab is None:
        return draft.lm_head(h)  # [rows, vocab_size]
    return torch.nn.functional.linear(h, draft.lm_head.weight[vocab])  # [rows, k]


def _columns(cfg: TrainConfig, vocab_size: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if cfg.vocab is None:
        return None, None
    vocab = cfg.vocab.long().to(cfg.device)
    column = torch.full((vocab_size,), -1, dtype=torch.long, device=cfg.device)
    column[vocab] = torch.arange(vocab.numel(), device=cfg.device)
    return vocab, column


@torch.no_grad()
def final_hidden(draft, samples: list[Sample], cfg: TrainConfig) -> torch.Tensor:
    """The draft's final hidden states at every response position of `samples` -> [rows, hidden_size]."""
    draft.eval()
    out = []
    for i in range(0, len(samples), cfg.batch_size):
        input_ids, mask, rows, _, _ = _batch(samples[i:i + cfg.batch_size], cfg.max_len, cfg.device)
        hidden = draft.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        out.append(hidden.flatten(0, 1)[rows].float())
    draft.train()
    return torch.cat(out)


@torch.no_grad()
def evaluate(draft, samples: list[Sample], cfg: TrainConfig) -> dict[str, float]:
    """KL and greedy agreement (draft argmax = target argmax) on held-out samples."""
    draft.eval()
    kl_sum, agree, n = 0.0, 0, 0
    vocab, column = _columns(cfg, draft.config.vocab_size)
    for i in range(0, len(samples), cfg.batch_size):
        input_ids, mask, rows, top_ids, top_lp = _batch(samples[i:i + cfg.batch_size], cfg.max_len, cfg.device)
        with torch.autocast(cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=_use_bf16(cfg)):
            logits = draft_logits_at(draft, input_ids, mask, rows, vocab)
        kl_sum += float(kl_topk(logits, top_ids, top_lp, column)) * rows.numel()
        best = logits.argmax(-1) if vocab is None else vocab[logits.argmax(-1)]
        agree += int((best == top_ids[:, 0].long()).sum())
        n += rows.numel()
    draft.train()
    return {"kl": kl_sum / max(n, 1), "greedy_agreement": agree / max(n, 1), "tokens": n}


def train(draft, train_samples: list[Sample], cfg: TrainConfig, checkpoint: Path, progress=True,
          log=print) -> dict:
    """Train `draft` in place; resumes from `checkpoint` if it exists. -> training summary."""
    from tqdm import tqdm

    draft.to(cfg.device).train()
    steps_per_epoch = math.ceil(len(train_samples) / cfg.batch_size)
    total = max(1, int(cfg.epochs * steps_per_epoch))
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    sched = warmup_cosine(opt, cfg, total)
    step, seconds = 0, 0.0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location=cfg.device, weights_only=False)
        draft.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, seconds = state["step"], state.get("seconds", 0.0)
        log(f"specray distill: resumed from {checkpoint} at step {step}/{total}")
    bar = tqdm(total=total, initial=step, desc="distill (train steps)", disable=not progress, mininterval=5)
    bf16 = _use_bf16(cfg)
    vocab, column = _columns(cfg, draft.config.vocab_size)
    loss_ema = None
    while step < total:
        epoch, offset = divmod(step, steps_per_epoch)
        order = list(range(len(train_samples)))
        random.Random(cfg.seed + epoch).shuffle(order)  # the same order on resume
        for b in range(offset, steps_per_epoch):
            if step >= total:
                break
            start = time.perf_counter()
            group = [train_samples[i] for i in order[b * cfg.batch_size:(b + 1) * cfg.batch_size]]
            input_ids, mask, rows, top_ids, top_lp = _batch(group, cfg.max_len, cfg.device)
            with torch.autocast(cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
                logits = draft_logits_at(draft, input_ids, mask, rows, vocab)
            value = optimizer_step(kl_topk(logits, top_ids, top_lp, column), list(draft.parameters()), opt, sched)
            step += 1
            seconds += time.perf_counter() - start
            loss_ema = value if loss_ema is None else 0.95 * loss_ema + 0.05 * value
            bar.set_postfix(kl=f"{loss_ema:.3f}", lr=f"{sched.get_last_lr()[0]:.1e}", refresh=False)
            bar.update(1)
            out_of_time = cfg.max_seconds is not None and seconds >= cfg.max_seconds
            if step % cfg.checkpoint_every == 0 or step == total or out_of_time:
                _save_checkpoint(checkpoint, draft, opt, sched, step, seconds)
            if out_of_time:
                log(f"specray distill: stopping at step {step}/{total} after {seconds:.0f}s (max_seconds)")
                total = step
                break
    bar.close()
    return {"steps": step, "train_seconds": round(seconds, 1), "final_kl_ema": loss_ema}


def run_training(module, params: list[torch.Tensor], batches: list[list[int]], loss_of, cfg: ScheduleConfig,
                 checkpoint: Path | None, desc: str, progress: bool = True, log=print) -> dict:
    """AdamW (warmup, then cosine) over `cfg.epochs` passes of `batches` (lists of example indices,
    shuffled per epoch by cfg.seed + epoch: the same order on resume); loss_of(batch, step) -> the
    step's loss. Checkpoints every `cfg.checkpoint_every` steps and resumes from `checkpoint`;
    stops early after `cfg.max_seconds` of training. -> summary."""
    from tqdm import tqdm

    module.train()
    total = max(1, int(cfg.epochs * len(batches)))
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = warmup_cosine(opt, cfg, total)
    step, seconds, ema = 0, 0.0, None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, seconds = state["step"], state.get("seconds", 0.0)
        log(f"specray distill: resumed from {checkpoint} at step {step}/{total}")
    bar = tqdm(total=total, initial=step, desc=desc, disable=not progress, mininterval=5)
    while step < total:
        epoch, offset = divmod(step, len(batches))
        shuffled = list(batches)
        random.Random(cfg.seed + epoch).shuffle(shuffled)
        for batch in shuffled[offset:]:
            start = time.perf_counter()
            value = optimizer_step(loss_of(batch, step), params, opt, sched)
            step += 1
            seconds += time.perf_counter() - start
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            bar.set_postfix(loss=f"{ema:.3f}", refresh=False)
            bar.update(1)
            out_of_time = cfg.max_seconds is not None and seconds >= cfg.max_seconds
            if checkpoint is not None and (step % cfg.checkpoint_every == 0 or step == total or out_of_time):
                _save_checkpoint(checkpoint, module, opt, sched, step, seconds)
            if out_of_time:
                log(f"specray distill: {desc} stopped at step {step}/{total} (max_seconds)")
                total = step
            if step >= total:
                break
    bar.close()
    return {"steps": step, "train_seconds": round(seconds, 1), "final_loss_ema": ema}


def optimizer_step(loss: torch.Tensor, params: list[torch.Tensor], opt, sched) -> float:
    """Backward, clip the gradient norm to 1, step the optimiser and the schedule -> the loss."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def _save_checkpoint(path: Path, draft, opt, sched, step: int, seconds: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": draft.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "step": step, "seconds": seconds}, tmp)
    tmp.rename(path)
