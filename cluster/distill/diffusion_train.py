"""The masked-diffusion objective for a DLLM, trained on the target's responses.

Each example is prompt + response padded with EOS to `gen_length` (so the model learns to fill a
canvas's tail with EOS). A ratio r ~ U(r_min, 1) masks response tokens, either uniformly or in the
shape semi-autoregressive decoding meets (decided tokens, a partly masked block, masks after it);
the loss is the cross-entropy at masked positions weighted by 1/r (LLaDA's SFT loss).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specray.cluster.distill.data import Sample
from specray.kernels.diffusion.model import DiffusionModel, _rms_norm
from specray.kernels.rope import apply_rotary


@dataclass(frozen=True)
class DiffusionExample:
    ids: list[int]  # prompt + response + EOS padding
    prompt_len: int

    def __post_init__(self) -> None:
        assert 1 <= self.prompt_len < len(self.ids)


def examples(samples: list[Sample], gen_length: int, eos: int, max_prompt: int) -> list[DiffusionExample]:
    out = []
    for s in samples:
        if not s.response_ids or len(s.prompt_ids) > max_prompt:
            continue
        response = list(s.response_ids[:gen_length])
        out.append(DiffusionExample(list(s.prompt_ids) + response + [eos] * (gen_length - len(response)),
                                    len(s.prompt_ids)))
    return out


def mask_example(ex: DiffusionExample, mask_id: int, block: int, rng: random.Random,
                 r_min: float = 0.05) -> tuple[list[int], list[int], float]:
    """-> (masked ids, masked positions, ratio)."""
    n = len(ex.ids) - ex.prompt_len
    r = rng.uniform(r_min, 1.0)
    if rng.random() < 0.5:  # uniform
        masked = [i for i in range(n) if rng.random() < r]
    else:  # semi-autoregressive: decided | a block masked at ratio r | masked
        cut = rng.randrange(0, n, block) if n > block else 0
        masked = [i for i in range(cut, n) if i >= cut + block or rng.random() < r]
    masked = masked or [rng.randrange(n)]
    ids = list(ex.ids)
    for i in masked:
        ids[ex.prompt_len + i] = mask_id
    return ids, [ex.prompt_len + i for i in masked], r


def train_logits(model: DiffusionModel, batch: torch.Tensor, lengths: list[int], rows: torch.Tensor) -> torch.Tensor:
    """Differentiable forward: batch [B, L] (padded), rows [n, 2] (sequence, position) -> logits [n, vocab]
    at those positions (shifted logits read position - 1)."""
    c = model.config.model
    b, n = batch.shape
    keys = torch.arange(n).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # [B, L] real tokens
    cos, sin = model.rotary.lookup(torch.arange(n))
    h = model.embed_tokens[batch]  # [B, L, hidden]
    for layer in model.layers:
        qkv = F.linear(_rms_norm(h, layer.attn_norm, model.eps), layer.qkv_proj, layer.qkv_bias)
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = apply_rotary(q.view(b * n, c.num_heads, c.head_dim), cos.repeat(b, 1, 1), sin.repeat(b, 1, 1))
        k = apply_rotary(k.reshape(b * n, c.num_kv_heads, c.head_dim), cos.repeat(b, 1, 1), sin.repeat(b, 1, 1))
        q, k = q.view(b, n, c.num_heads, c.head_dim), k.view(b, n, c.num_kv_heads, c.head_dim)
        v = v.view(b, n, c.num_kv_heads, c.head_dim)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              attn_mask=keys[:, None, None, :], enable_gqa=True)
        h = h + F.linear(attn.transpose(1, 2).reshape(b, n, c.q_size), layer.o_proj)
        gate, up = F.linear(_rms_norm(h, layer.ffn_norm, model.eps), layer.gate_up_proj).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, layer.down_proj)
    shift = 1 if model.config.shift_logits else 0
    picked = h[rows[:, 0], rows[:, 1] - shift]  # [n, hidden]
    return F.linear(_rms_norm(picked, model.norm, model.eps), model.lm_head)


def diffusion_loss(model: DiffusionModel, batch: list[DiffusionExample], block: int, rng: random.Random) -> torch.Tensor:
    """LLaDA's loss: sum over masked tokens of CE / ratio, per example divided by its response length."""
    mask_id = model.config.mask_token_id
    masked = [mask_example(ex, mask_id, block, rng) for ex in batch]
    lengths = [len(ex.ids) for ex in batch]
    ids = torch.full((len(batch), max(lengths)), mask_id, dtype=torch.long)
    for i, (m, _, _) in enumerate(masked):
        ids[i, :len(m)] = torch.tensor(m)
    rows = torch.tensor([(i, p) for i, (_, ps, _) in enumerate(masked) for p in ps])  # [n, 2]
    targets = torch.tensor([batch[i].ids[p] for i, p in rows.tolist()])
    weights = torch.tensor([1.0 / (r * (len(ex.ids) - ex.prompt_len)) for ex, (_, ps, r) in zip(batch, masked)
                            for _ in ps])
    ce = F.cross_entropy(train_logits(model, ids, lengths, rows), targets, reduction="none")
    return (ce * weights).sum() / len(batch)


@torch.no_grad()
def masked_token_loss(model: DiffusionModel, exs: list[DiffusionExample], ratio: float, seed: int = 0) -> float:
    """Mean cross-entropy (nats) at masked response tokens when each is masked with `ratio`."""
    rng = random.Random(seed)
    total, count = 0.0, 0
    for ex in exs:
        n = len(ex.ids) - ex.prompt_len
        pos = [ex.prompt_len + i for i in range(n) if rng.random() < ratio] or [ex.prompt_len]
        ids = torch.tensor(ex.ids)
        ids[pos] = model.config.mask_token_id
        logits = train_logits(model, ids.unsqueeze(0), [len(ex.ids)], torch.tensor([(0, p) for p in pos]))
        total += float(F.cross_entropy(logits, torch.tensor([ex.ids[p] for p in pos]), reduction="sum"))
        count += len(pos)
    return total / max(count, 1)
