"""Training the LongSpec draft (kernels/drafters/longspec_model.py) on the target's own outputs.

Data: each distillation sequence (prompt + the target's response) runs once through the target
(transformers, fp32) at anchor-offset positions: the first `sink` (0-4) tokens keep positions
0.., the rest are shifted by a random offset, so short samples exercise the long positions a long
context reaches. The target's last-layer keys and values (what the draft cross-attends) and its
final hidden states (the teacher: its head on them) are kept in fp16 (`extract_target_kv`).
Loss per position: KL(target || draft) over the VocabTrim subset. Each batch draws a lag of 1-4:
position i cross-attends target positions <= i - lag, as a target cache that does not cover the
unverified draft tokens yet. Long sequences train on their last `max_len` positions as queries
while the cross-attention reads every earlier target position.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from specray.cluster.distill.data import Sample
from specray.cluster.distill.train import ScheduleConfig
from specray.kernels.config import ModelConfig
from specray.kernels.drafters.longspec_model import LongSpecLayer, attend, lag_mask


@dataclass
class KVSeq:
    """One training sequence: tokens, the positions it ran at, the target's last-layer KV and features."""

    token_ids: torch.Tensor  # [S] int32
    positions: torch.Tensor  # [S] int64, anchor-offset
    target_kv: torch.Tensor  # [S, 2, K, D] fp16, keys post-RoPE at `positions`
    features: torch.Tensor  # [S, hidden] fp16, the target's post-norm final hidden states

    def __post_init__(self) -> None:
        s = self.token_ids.shape[0]
        assert s >= 2 and self.positions.shape == (s,) and self.target_kv.shape[0] == self.features.shape[0] == s


@dataclass
class LongSpecTrainConfig(ScheduleConfig):
    lr: float = 1e-3
    warmup_steps: int = 20
    max_len: int = 512  # query positions per sequence and step (the last ones)
    checkpoint_every: int = 50
    max_lag: int = 4  # the cross-attention lags by 1..max_lag positions
    max_sink: int = 4  # anchor tokens that keep their positions
    position_limit: int = 8192  # offsets keep positions below this (the target's context)


def anchor_positions(n: int, rng: random.Random, limit: int, max_sink: int) -> torch.Tensor:
    """[n] positions: the first `sink` keep 0..sink-1, the rest shift by a random offset below `limit`."""
    sink = rng.randint(0, max_sink)
    offset = rng.randint(0, max(limit - n, 0))
    positions = torch.arange(n)
    positions[sink:] += offset
    return positions


def last_layer_kv(cache) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' DynamicCache (4.56+: `.layers`) -> the last layer's keys, values [B, K, S, D]."""
    layer = cache.layers[-1]
    return layer.keys, layer.values


@torch.inference_mode()
def extract_target_kv(target_hf, samples: list[Sample], cfg: LongSpecTrainConfig, seed: int,
                      progress: bool = True) -> list[KVSeq]:
    from tqdm import tqdm

    rng = random.Random(seed)
    out = []
    for s in tqdm(samples, desc="longspec (target KV)", disable=not progress, mininterval=5):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        positions = anchor_positions(ids.shape[1], rng, cfg.position_limit, cfg.max_sink)
        res = target_hf.model(input_ids=ids, position_ids=positions[None], use_cache=True)
        k, v = last_layer_kv(res.past_key_values)  # [1, K, S, D]
        kv = torch.stack([k[0], v[0]], 0).permute(2, 0, 1, 3)  # [S, 2, K, D]
        out.append(KVSeq(ids[0].to(torch.int32), positions, kv.to(torch.float16),
                         res.last_hidden_state[0].to(torch.float16)))
    return out


def init_longspec(state: dict[str, torch.Tensor], hf_config, window: int) -> LongSpecLayer:
    """Start from the target's layers: the self-attention from its first layer (it reads the
    embedding, as layer 0 does), the cross-attention and MLP from its last (whose attention reads
    exactly the KV the draft cross-attends), the final norm."""
    config = ModelConfig.from_hf(hf_config)
    layer = LongSpecLayer(config, window)
    last = config.num_layers - 1

    def get(name: str) -> torch.Tensor:
        return state[f"model.{name}"] if f"model.{name}" in state else state[name]

    first, final = "layers.0.", f"layers.{last}."
    with torch.no_grad():
        layer.input_norm.copy_(get(first + "input_layernorm.weight"))
        layer.qkv_proj.copy_(torch.cat([get(first + f"self_attn.{n}_proj.weight") for n in "qkv"]))
        layer.o_proj.copy_(get(first + "self_attn.o_proj.weight"))
        layer.cross_norm.copy_(get(final + "input_layernorm.weight"))
        layer.cross_q_proj.copy_(get(final + "self_attn.q_proj.weight"))
        layer.cross_o_proj.copy_(get(final + "self_attn.o_proj.weight"))
        layer.post_norm.copy_(get(final + "post_attention_layernorm.weight"))
        layer.gate_up_proj.copy_(torch.cat([get(final + f"mlp.{n}_proj.weight") for n in ("gate", "up")]))
        layer.down_proj.copy_(get(final + "mlp.down_proj.weight"))
        layer.norm.copy_(get("norm.weight"))
    return layer


def windowed_forward(layer: LongSpecLayer, seq: KVSeq, embed: torch.Tensor, max_len: int, lag: int):
    """One sequence, queries = its last max_len - 1 positions that have a next token -> (hidden
    [1, n, hidden], teacher rows index [n]): hidden at index i predicts token i + 1."""
    s, w = seq.token_ids.shape[0], layer.window
    start = max(0, s - 1 - max_len)
    kstart = max(0, start - w + 1)
    emb = embed[seq.token_ids[kstart:s - 1].long()].unsqueeze(0)  # [1, s - 1 - kstart, hidden]
    q, k, v = layer.self_qkv(emb, seq.positions[kstart:s - 1].unsqueeze(0))
    qi = torch.arange(start, s - 1)  # query indices
    ki = torch.arange(kstart, s - 1)
    self_visible = (ki[None, :] <= qi[:, None]) & (ki[None, :] > qi[:, None] - w)  # [n, keys]
    off = start - kstart
    self_out = attend(q[:, off:], k, v, self_visible.unsqueeze(0), sink=False)
    kv = seq.target_kv.float()  # [s, 2, K, D]
    cross = lag_mask(s, s, lag)[start:s - 1].unsqueeze(0)  # [1, n, s]
    hidden = layer.finish(emb[:, off:], self_out, seq.positions[start:s - 1].unsqueeze(0), kv[None, :, 0],
                          kv[None, :, 1], cross)
    return hidden, qi


def _kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean KL(softmax(teacher) || softmax(student)) over rows; both [rows, k] logits."""
    logq = teacher.log_softmax(-1)
    return (logq.exp() * (logq - student.log_softmax(-1))).sum(-1).mean()


def step_loss(layer: LongSpecLayer, seqs: list[KVSeq], embed: torch.Tensor, head: torch.Tensor,
              cfg: LongSpecTrainConfig, rng: random.Random) -> torch.Tensor:
    lag = rng.randint(1, cfg.max_lag)
    students, teachers = [], []
    for seq in seqs:
        hidden, rows = windowed_forward(layer, seq, embed, cfg.max_len, lag)
        students.append(hidden[0] @ head.T)  # [n, k]
        with torch.no_grad():
            teachers.append(seq.features[rows].float() @ head.T)  # the target's logits for token i + 1
    return _kl(torch.cat(students), torch.cat(teachers))


@torch.no_grad()
def evaluate(layer: LongSpecLayer, seqs: list[KVSeq], embed: torch.Tensor, head_full: torch.Tensor,
             cfg: LongSpecTrainConfig) -> dict[str, float]:
    """Greedy agreement with the target (argmax of the full head) at lag 1 (a round's first draft
    token) and lag 3 (its third)."""
    layer.eval()
    result: dict[str, float] = {}
    for lag in (1, 3):
        agree = n = 0
        for seq in seqs:
            hidden, rows = windowed_forward(layer, seq, embed, cfg.max_len, lag)
            best = (seq.features[rows].float() @ head_full.T).argmax(-1)
            agree += int(((hidden[0] @ head_full.T).argmax(-1) == best).sum())
            n += rows.shape[0]
        result[f"agreement_lag{lag}"] = agree / max(n, 1)
        result["positions"] = n
    layer.train()
    return result
