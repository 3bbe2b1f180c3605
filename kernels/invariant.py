"""Row-invariant steps for the torch path: a row's numbers do not depend on how many rows its step
holds, nor on which other rows share it.

Greedy speculation equals greedy plain decoding only if the target computes a verified row exactly
as the one-row step of plain decoding would. The CPU's C kernels are built that way; library
kernels are not: cuBLAS (and MKL in half precision) pick their algorithm, and with it the order of
a dot product's additions, by the matrix shapes, so a row's logits move in the last bits with the
step's row count (scripts/row_invariance_check.py; docs/performance.md has the H100's figures)
and a near-tie flips a greedy token. Here every shape a row meets is fixed:

- the step's rows are padded to a multiple of `chunk_rows(device)` once, and every row-wise op
  (projections, RMSNorm) runs on chunks of exactly that many rows;
- RoPE is elementwise (a batched matmul per token would vary with the step's token count);
- on a CPU the SiLU runs on one thread (`silu_mul`: a thread's last elements take the scalar exp);
- attention gathers each row's visible keys (context, then its own ancestry) into a compacted list
  and walks it in blocks of KEY_BLOCK keys with an online softmax, chunks of `attention_rows(device)`
  rows at a time, every block one fixed-shape call: a row's result depends on its keys alone, and a
  block past a row's own keys adds exact zeros.

The math is `kernels/attention_reference.py`'s reference; only the association of the sums differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from specray.kernels.attention import sequence_mask
from specray.kernels.batch import RaggedBatch

KEY_BLOCK = 512  # keys a row's attention takes per fixed-shape call: most decode contexts in one


def chunk_rows(device: torch.device) -> int:
    """Rows of every row-wise call: on a GPU a 128-row projection costs what one row does (the step
    is bound by launches and weight reads); on a CPU padding costs compute, so 16."""
    return 16 if device.type == "cpu" else 128


def attention_rows(device: torch.device) -> int:
    """Query rows of every attention call (each gathers its rows' keys: fewer than `chunk_rows`)."""
    return 16 if device.type == "cpu" else 64


def pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """x [rows, ...] with zero rows appended up to a multiple of `multiple`."""
    extra = -x.shape[0] % multiple
    return x if extra == 0 else torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])


def per_chunk(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn applied to x [rows, ...] in chunks of exactly chunk_rows rows (the last zero-padded)."""
    rows, size = x.shape[0], chunk_rows(x.device)
    x = pad_rows(x, size)
    out = fn(x) if x.shape[0] == size else torch.cat([fn(part) for part in x.split(size)])
    return out[:rows]


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows, in] @ weight [out, in]^T -> [rows, out]."""
    return per_chunk(lambda part: F.linear(part, weight), x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [rows, hidden]."""
    return per_chunk(lambda part: F.rms_norm(part, (part.shape[-1],), weight, eps), x)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up [rows, n]. On a CPU on one thread: torch splits an elementwise op's elements
    between threads anywhere, and an element at the end of a thread's part takes the scalar exp, whose
    last bit differs from the vector one's, so at 3+ threads a row's bits followed the row count."""
    threads = torch.get_num_threads()
    if gate.device.type != "cpu" or threads == 1:
        return F.silu(gate) * up
    torch.set_num_threads(1)
    try:
        return F.silu(gate) * up
    finally:
        torch.set_num_threads(threads)


def compact(slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """slots [keys]; mask [rows, keys] bool -> [rows, keys]: row r's visible slots first, in key
    order, then slot 0."""
    rows, keys = mask.shape
    position = torch.where(mask, mask.long().cumsum(1) - 1, keys)  # [rows, keys]; keys: dropped
    out = torch.zeros(rows, keys + 1, dtype=torch.long)
    out.scatter_(1, position, slots.expand(rows, keys))
    return out[:, :keys]


@dataclass
class KeyBlock:
    """One fixed-shape attention call's keys for a chunk of rows."""

    slots: torch.Tensor  # [rows, KEY_BLOCK] long: cache slots (slot 0 where a row has no key left)
    hidden: torch.Tensor  # [rows, KEY_BLOCK] bool: True where that slot is not one of the row's keys

    def __post_init__(self) -> None:
        assert self.slots.shape == self.hidden.shape and self.slots.dtype == torch.long


@dataclass
class AttentionPlan:
    """A step's attention at fixed shapes, built once and read by every layer: its rows (padded to
    whole chunks of `attention_rows`), each chunk's visible keys in blocks of KEY_BLOCK."""

    chunks: list[list[KeyBlock]]  # per chunk of rows, its key blocks in key order

    def __post_init__(self) -> None:
        assert self.chunks and all(blocks for blocks in self.chunks)

    @classmethod
    def build(cls, batch: RaggedBatch) -> AttentionPlan:
        slots, counts = visible_keys(batch)  # [rows, width], [rows]
        device, size = batch.key_slots.device, attention_rows(batch.key_slots.device)
        rows = slots.shape[0]
        slots = pad_rows(slots, size)
        counts = torch.cat([counts, counts.new_ones(slots.shape[0] - rows)])  # fillers see slot 0 only
        chunks = []
        for start in range(0, slots.shape[0], size):
            part, seen = slots[start:start + size], counts[start:start + size]
            width = -(-int(seen.max()) // KEY_BLOCK) * KEY_BLOCK
            part = F.pad(part[:, :width], (0, max(width - part.shape[1], 0)))
            hidden = torch.arange(width) >= seen[:, None]  # [size, width]
            chunks.append([KeyBlock(s.to(device), h.to(device)) for s, h in
                           zip(part.split(KEY_BLOCK, dim=1), hidden.split(KEY_BLOCK, dim=1))])
        return cls(chunks)


def visible_keys(batch: RaggedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's visible keys as cache slots, compacted in key order (context, then its ancestry)
    -> slots [rows, width] long (padded with slot 0) and counts [rows] (each >= 1), on the CPU."""
    key_slots = batch.key_slots.cpu()
    parts, counts = [], []
    for b in range(batch.batch_size):
        q0, q1 = batch.cu_seqlens[b], batch.cu_seqlens[b + 1]
        k0, k1 = batch.cu_keylens[b], batch.cu_keylens[b + 1]
        k1 -= batch.key_pads[b] if batch.key_pads else 0
        mask = sequence_mask(batch.context_lens[b], batch.parents[b], q1 - q0)  # [rows, keys]
        assert mask.shape[1] == k1 - k0, "a sequence's keys are its context and its new tokens"
        parts.append(compact(key_slots[k0:k1], mask))
        counts.append(mask.sum(1))
    width = max(p.shape[1] for p in parts)
    return torch.cat([F.pad(p, (0, width - p.shape[1])) for p in parts]), torch.cat(counts)


def attention(q: torch.Tensor, layer_kv: torch.Tensor, plan: AttentionPlan, scale: float) -> torch.Tensor:
    """q [padded rows, num_heads, head_dim]; layer_kv [2 * num_kv_heads, num_slots, head_dim] (the
    cache layer, this step's keys written) -> [padded rows, num_heads * head_dim] (filler rows: any)."""
    size = attention_rows(q.device)
    out = [chunk_attention(q[i * size:(i + 1) * size], layer_kv, blocks, scale) for i, blocks in enumerate(plan.chunks)]
    out = torch.cat(out) if len(out) > 1 else out[0]
    return pad_rows(out, chunk_rows(q.device))[:q.shape[0]]


def chunk_attention(q: torch.Tensor, layer_kv: torch.Tensor, blocks: list[KeyBlock], scale: float) -> torch.Tensor:
    """One chunk of rows: q [rows, num_heads, head_dim] -> [rows, num_heads * head_dim], by an
    online softmax over its key blocks. A block past a row's keys leaves it exactly as it was: its
    maximum holds (decay exp(0) = 1) and its weights are exp(-inf) = 0."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = layer_kv.shape[0] // 2
    group = num_heads // num_kv_heads
    qg = q.reshape(rows, num_kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim)  # [kv_heads * rows, group, D]
    for j, block in enumerate(blocks):
        kv = layer_kv[:, block.slots]  # [2 * num_kv_heads, rows, KEY_BLOCK, head_dim]
        k = kv[:num_kv_heads].reshape(-1, KEY_BLOCK, head_dim).to(q.dtype)  # [kv_heads * rows, KEY_BLOCK, D]
        v = kv[num_kv_heads:].reshape(-1, KEY_BLOCK, head_dim).to(q.dtype)
        scores = torch.bmm(qg, k.transpose(1, 2)).float().mul_(scale)  # [kv_heads * rows, group, KEY_BLOCK]
        scores.view(num_kv_heads, rows, group, KEY_BLOCK).masked_fill_(block.hidden[None, :, None, :], float("-inf"))
        if j == 0:  # key 0 is every row's: the maximum is finite from here on
            top = scores.amax(-1)  # [kv_heads * rows, group]
            weights = (scores - top[..., None]).exp_()
            mass, acc = weights.sum(-1), torch.bmm(weights.to(v.dtype), v).float()  # [.., group], [.., group, D]
            continue
        new_top = torch.maximum(top, scores.amax(-1))
        decay = (top - new_top).exp_()  # 1 where the maximum held
        weights = (scores - new_top[..., None]).exp_()
        mass = mass * decay + weights.sum(-1)
        acc = acc * decay[..., None] + torch.bmm(weights.to(v.dtype), v).float()
        top = new_top
    out = (acc / mass[..., None]).to(q.dtype)  # [kv_heads * rows, group, D]
    return out.view(num_kv_heads, rows, group, head_dim).transpose(0, 1).reshape(rows, num_heads * head_dim)


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding elementwise: x [rows, heads, head_dim]; cos, signed_sin [rows, 1, head_dim]
    with signed_sin = (-sin, sin) over the halves, so that x rotated = x * cos + roll(x) * signed_sin."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def rope_tables(model, positions: torch.Tensor, padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [padded, 1, head_dim] of the step's positions (fillers: position 0)."""
    cos, sin = model.rotary.cos[positions], model.rotary.sin[positions]  # [rows, head_dim]
    half = cos.shape[-1] // 2
    signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
    return pad_rows(cos, padded)[:, None], pad_rows(signed, padded)[:, None]


def layer_loop(model, batch: RaggedBatch, cache, h: torch.Tensor) -> torch.Tensor:
    """`LlamaModel.layer_loop` at fixed shapes: h [rows, hidden] embedded -> the residual stream after
    the last layer [rows, hidden]. The rows are padded once; filler rows never reach the cache."""
    c, tp, eps = model.shard_config, model.tp_group, model.config.rms_norm_eps
    rows, size = h.shape[0], chunk_rows(h.device)
    h = pad_rows(h, size)  # [padded, hidden]
    cos, signed_sin = rope_tables(model, batch.positions, size)
    plan = AttentionPlan.build(batch)
    x = rms_norm(h, model.layers[0].input_norm, eps)
    for i, layer in enumerate(model.layers):
        qkv = linear(x, layer.qkv_proj).view(-1, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
        qk = rope(qkv[:, :c.num_heads + c.num_kv_heads], cos, signed_sin)
        new_kv = torch.cat([qk[:rows, c.num_heads:], qkv[:rows, c.num_heads + c.num_kv_heads:]], dim=1)
        layer_kv = cache.kv[i]  # [2 * num_kv_heads, num_slots, head_dim]
        layer_kv.index_copy_(1, batch.slot_mapping, new_kv.transpose(0, 1).to(layer_kv.dtype))
        attn = attention(qk[:, :c.num_heads], layer_kv, plan, model.scale)
        h = h + tp.all_reduce(linear(attn, layer.o_proj))
        x = rms_norm(h, layer.post_attention_norm, eps)
        gate, up = linear(x, layer.gate_up_proj).chunk(2, dim=-1)
        h = h + tp.all_reduce(linear(silu_mul(gate, up), layer.down_proj))
        if i + 1 < len(model.layers):
            x = rms_norm(h, model.layers[i + 1].input_norm, eps)
    return h[:rows]
