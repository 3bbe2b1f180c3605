"""Training the feature-level draft (cluster/distill/eagle_model.py) on the target's own hidden states.

Data: the distillation shards (the target's responses, cluster/distill/data.py) run once through the
target to record its final hidden state f at every position (`extract_features`, fp16 on disk).
Loss per position: KL(target || draft) over the VocabTrim subset, the target's distribution being
its head on the true f_{i+1}, plus a smooth-L1 pull of g_{i+1} towards f_{i+1}. A second, unrolled
pass feeds the draft its own predictions g in place of f (detached), as drafting beyond the first
token does; without it the later draft tokens see inputs it never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specray.cluster.distill.data import Sample
from specray.cluster.distill.eagle_model import EagleDraft
from specray.cluster.distill.train import ScheduleConfig


@dataclass
class FeatureSeq:
    """One training sequence: its tokens and the target's final hidden state at each of them."""

    token_ids: torch.Tensor  # [T] int32
    features: torch.Tensor  # [T, hidden_size] fp16, post-norm

    def __post_init__(self) -> None:
        assert self.token_ids.dim() == 1 and self.features.shape[0] == self.token_ids.shape[0] >= 2


@dataclass
class EagleTrainConfig(ScheduleConfig):
    lr: float = 5e-4
    warmup_steps: int = 20
    max_len: int = 384
    checkpoint_every: int = 50
    reg_weight: float = 1.0  # smooth-L1 on features, next to the KL
    noise: float = 0.05  # uniform noise on input features, a fraction of their RMS (robustness)
    unroll: bool = True  # the second pass on the draft's own predictions


@torch.inference_mode()
def extract_features(target_hf, samples: list[Sample], progress=True) -> list[FeatureSeq]:
    """Run each prompt + response through the transformers target -> its post-norm final hidden states."""
    from tqdm import tqdm

    out = []
    for s in tqdm(samples, desc="eagle (target features)", disable=not progress, mininterval=5):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        hidden = target_hf.model(input_ids=ids).last_hidden_state[0]  # [T, hidden_size]
        out.append(FeatureSeq(ids[0].to(torch.int32), hidden.to(torch.float16)))
    return out


def _batch(seqs: list[FeatureSeq], embed: torch.Tensor, max_len: int):
    """-> features f_i [B, L, H], embeddings of x_{i+1} [B, L, H], targets f_{i+1} [B, L, H], mask [B, L]."""
    n = [min(len(s.token_ids), max_len) - 1 for s in seqs]
    width, h = max(n), embed.shape[1]
    feat = torch.zeros(len(seqs), width, h)
    emb = torch.zeros(len(seqs), width, h)
    tgt = torch.zeros(len(seqs), width, h)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for b, (s, m) in enumerate(zip(seqs, n, strict=True)):
        f = s.features[:m + 1].float()
        feat[b, :m], tgt[b, :m] = f[:-1], f[1:]
        emb[b, :m] = embed[s.token_ids[1:m + 1].long()]
        mask[b, :m] = 1
    return feat, emb, tgt, mask


def _kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean KL(softmax(teacher) || softmax(student)) over rows; both [rows, k] logits."""
    logq = teacher.log_softmax(-1)
    return (logq.exp() * (logq - student.log_softmax(-1))).sum(-1).mean()


def _pass_loss(draft, feat, emb, tgt, mask, head, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass -> (loss, predicted features [B, L, H])."""
    g = draft(feat, emb, mask)
    valid = mask.bool()
    gv, tv = g[valid], tgt[valid]  # [rows, H]
    with torch.no_grad():
        teacher = tv @ head.T  # [rows, k]
    loss = _kl(gv @ head.T, teacher) + cfg.reg_weight * F.smooth_l1_loss(gv, tv)
    return loss, g


def step_loss(draft: EagleDraft, seqs: list[FeatureSeq], embed: torch.Tensor, head: torch.Tensor,
              cfg: EagleTrainConfig, gen: torch.Generator) -> torch.Tensor:
    feat, emb, tgt, mask = _batch(seqs, embed, cfg.max_len)
    if cfg.noise:
        rms = feat.pow(2).mean(-1, keepdim=True).sqrt()
        feat = feat + (torch.rand(feat.shape, generator=gen) * 2 - 1) * cfg.noise * rms
    loss, g = _pass_loss(draft, feat, emb, tgt, mask, head, cfg)
    if cfg.unroll:  # row i now reads g_i (predicted at row i-1) instead of f_i
        fed = torch.cat([feat[:, :1], g[:, :-1].detach()], dim=1)
        loss2, _ = _pass_loss(draft, fed, emb, tgt, mask, head, cfg)
        loss = 0.5 * (loss + loss2)
    return loss


@torch.no_grad()
def evaluate(draft: EagleDraft, seqs: list[FeatureSeq], embed: torch.Tensor, head_full: torch.Tensor,
             cfg: EagleTrainConfig) -> dict[str, float]:
    """Greedy agreement with the target (argmax of the full head on g vs on f) with true input
    features (the first draft token) and with the draft's own (the second)."""
    draft.eval()
    agree1 = agree2 = n = 0
    kl = 0.0
    for i in range(0, len(seqs), cfg.batch_size):
        feat, emb, tgt, mask = _batch(seqs[i:i + cfg.batch_size], embed, cfg.max_len)
        valid = mask.bool()
        g = draft(feat, emb, mask)
        g2 = draft(torch.cat([feat[:, :1], g[:, :-1]], dim=1), emb, mask)
        teacher, student = tgt[valid] @ head_full.T, g[valid] @ head_full.T  # [rows, vocab]
        best = teacher.argmax(-1)
        agree1 += int((student.argmax(-1) == best).sum())
        agree2 += int(((g2[valid] @ head_full.T).argmax(-1) == best).sum())
        kl += float(_kl(student, teacher)) * int(valid.sum())
        n += int(valid.sum())
    draft.train()
    return {"agreement_step1": agree1 / max(n, 1), "agreement_step2": agree2 / max(n, 1),
            "kl_step1": kl / max(n, 1), "positions": n}


def train_eagle(draft: EagleDraft, seqs: list[FeatureSeq], embed: torch.Tensor, head: torch.Tensor,
                cfg: EagleTrainConfig, checkpoint: Path | None = None, progress=True, log=print) -> dict:
    """Train in place (cluster/distill/train.py `run_training`) -> summary. embed [vocab, H]; head [k, H]
    (VocabTrim rows). A run resumes from `checkpoint` if it exists."""
    from specray.cluster.distill.train import run_training

    if not seqs:
        raise ValueError("eagle training needs at least one sequence")
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].token_ids))  # batches of like lengths
    batches = [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    gens: dict[str, torch.Generator] = {}

    def loss_of(batch: list[int], step: int) -> torch.Tensor:
        if "noise" not in gens:  # feature noise, seeded at the first step this run takes
            gens["noise"] = torch.Generator().manual_seed(cfg.seed + step)
        return step_loss(draft, [seqs[i] for i in batch], embed, head, cfg, gens["noise"])

    return run_training(draft, draft.trainable(), batches, loss_of, cfg, checkpoint, "eagle (train steps)",
                        progress, log)
