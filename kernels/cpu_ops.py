"""Fused CPU ops for few-row steps (C in `csrc/`), each beside its pure torch reference.

A batch-1 decode step of a small model is some 600 eager ops, whose dispatch costs more than their
arithmetic. These replace the norm (one call instead of about eight ops), the residual add + norm,
RoPE + the KV write (a bmm, a cat and an index_copy_), and attention for steps of short sequences
(decode and verification rows, chains or trees, any batch; `csrc/attention.c`) in one call instead
of about ten ops per sequence group. `decoder_layers` then runs every layer of such a step in one
call (`csrc/decoder.c`: the same kernels, the same order, faster than the op-by-op calls).
Callers use them only where `available()`: CPU, fp32, a compiled library. `attention`'s reference
is `attention_reference.reference_attention`; `decoder_layers`' is the model's op-by-op layer loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specray.kernels import cpu_kernels
from specray.kernels.hybrid_attention import HYBRID, NEVER_SPLIT
from specray.kernels.batch import RaggedBatch
from specray.kernels.fast_linear import KINDS as FAST_KINDS, FastWeight
from specray.kernels.quant_linear import KINDS as EXACT_KINDS, PackedWeight
from specray.kernels.rope import apply_rotary
from specray.kernels.step_masks import new_token_mask


def available() -> bool:
    return cpu_kernels.available()


def _ptr(t: torch.Tensor) -> int:
    assert t.is_contiguous() and t.device.type == "cpu", "C ops take contiguous CPU tensors"
    return t.data_ptr()


def _kv_half(kv: torch.Tensor) -> int:
    """1 for an fp16 KV cache, 0 for fp32 (the C ops take no other)."""
    assert kv.dtype in (torch.float32, torch.float16), f"C attention reads fp32 or fp16 KV, not {kv.dtype}"
    return int(kv.dtype == torch.float16)


# -- references ---------------------------------------------------------------------------------
def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_store_kv_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                            layer_kv: torch.Tensor, num_heads: int) -> None:
    """qkv [rows, heads + 2 * kv_heads, dim] (rotated in place on its q and k heads);
    cos, sin [rows, dim]; layer_kv [2 * kv_heads, num_slots, dim] (fp32 or fp16) gets k and v at
    `slots` [rows]."""
    num_kv_heads = (qkv.shape[1] - num_heads) // 2
    qk = qkv[:, : num_heads + num_kv_heads]
    qk.copy_(apply_rotary(qk, cos.unsqueeze(1), sin.unsqueeze(1)))
    layer_kv.index_copy_(1, slots, qkv[:, num_heads:].transpose(0, 1).to(layer_kv.dtype))


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# -- fast paths -----------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, n] -> [rows, n]: weight * (x * rsqrt(mean(x^2) + eps))."""
    _check_norm(x, weight)
    y = torch.empty_like(x)
    cpu_kernels.library().specray_rms_norm(_ptr(x), x.shape[0], x.shape[1], _ptr(weight), eps, _ptr(y))
    return y


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """h += delta (in place, the residual stream), then -> rms_norm(h) [rows, n]."""
    assert h.shape == delta.shape and delta.dtype == torch.float32
    _check_norm(h, weight)
    y = torch.empty_like(h)
    cpu_kernels.library().specray_add_rms_norm(_ptr(h), _ptr(delta), h.shape[0], h.shape[1], _ptr(weight),
                                                eps, _ptr(y))
    return y


def _check_norm(x: torch.Tensor, weight: torch.Tensor) -> None:
    assert x.dim() == 2 and x.dtype == weight.dtype == torch.float32 and weight.shape == (x.shape[1],)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2 * n] (gate first) -> silu(gate) * up [rows, n], as the decoder layers compute it."""
    assert gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0 and gate_up.dtype == torch.float32
    gate_up = gate_up.contiguous()
    act = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=torch.float32)  # [rows, n]
    cpu_kernels.library().specray_silu_mul(_ptr(gate_up), act.shape[0], act.shape[1], _ptr(act))
    return act


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [rows, n] -> int64 [rows], exactly `x.argmax(-1)` (the first maximum; a NaN wins) and its
    reference; in C for CPU fp32 rows (torch's CPU argmax is slow there: docs/performance.md)."""
    if not (available() and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2
            and x.shape[1] > 0):
        return x.argmax(-1)
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.long)
    cpu_kernels.library().specray_argmax_rows(_ptr(x), x.shape[0], x.shape[1], _ptr(out), torch.get_num_threads())
    return out


def rope_store_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                  layer_kv: torch.Tensor, num_heads: int) -> None:
    """As `rope_store_kv_reference`, in one call."""
    rows, width, dim = qkv.shape
    num_kv_heads = (width - num_heads) // 2
    assert cos.shape == sin.shape == (rows, dim) and slots.shape == (rows,) and slots.dtype == torch.int64
    assert qkv.dtype == cos.dtype == sin.dtype == torch.float32
    assert layer_kv.shape[0] == 2 * num_kv_heads and layer_kv.shape[2] == dim
    cpu_kernels.library().specray_rope_store_kv(
        _ptr(qkv), rows, num_heads, num_kv_heads, dim, _ptr(cos), _ptr(sin), _ptr(slots), _ptr(layer_kv),
        layer_kv.shape[1], _kv_half(layer_kv))


@dataclass
class AttentionRows:
    """Which keys each query row of a step sees, for `attention`: its sequence's context, then the
    new tokens of its ancestry (chain: the earlier ones). Padded-baseline dummy keys are scored and
    dropped, so that baseline keeps its padded cost."""

    key_start: torch.Tensor  # int64 [num_tokens] the row's sequence's first key in key_slots
    num_ctx: torch.Tensor  # int64 [num_tokens] context keys, all visible
    num_new: torch.Tensor  # int64 [num_tokens] the sequence's new tokens (their keys follow the context)
    num_pad: torch.Tensor  # int64 [num_tokens] dummy keys after those (padded baseline), never visible
    new_mask: torch.Tensor  # uint8 [num_tokens, max_new] 1 where new token j is visible
    max_keys: int  # the most keys any row scores

    def __post_init__(self):
        rows = self.key_start.shape[0]
        assert self.num_ctx.shape == self.num_new.shape == self.num_pad.shape == (rows,)
        assert self.new_mask.shape[0] == rows and self.new_mask.dtype == torch.uint8
        assert all(t.dtype == torch.int64 for t in (self.key_start, self.num_ctx, self.num_new, self.num_pad))

    @classmethod
    def build(cls, batch: RaggedBatch) -> "AttentionRows":
        """Every step, prefill chunks included: the C attention's rows do not depend on the step
        (the fused SDPA path is faster for long prefills, but a row's numbers would then depend on
        whether a prefill rode in its step)."""
        counts = [batch.cu_seqlens[b + 1] - batch.cu_seqlens[b] for b in range(batch.batch_size)]
        pads, max_new = batch.key_pads or [0] * batch.batch_size, max(counts)
        per_row: list[list[int]] = [[], [], [], []]  # key_start, num_ctx, num_new, num_pad
        for b, n in enumerate(counts):
            for column, value in zip(per_row, (batch.cu_keylens[b], batch.context_lens[b], n, pads[b])):
                column += [value] * n
        max_keys = max(c + n + p for c, n, p in zip(batch.context_lens, counts, pads))
        columns = torch.tensor(per_row, dtype=torch.int64)  # [4, num_tokens]: one call, contiguous rows
        return cls(*columns.unbind(), new_token_mask(batch.parents, counts, max_new), max_keys)


def attention(qkv: torch.Tensor, num_heads: int, layer_kv: torch.Tensor, key_slots: torch.Tensor,
              rows: AttentionRows, scale: float, split: bool = True) -> torch.Tensor:
    """qkv [num_tokens, heads + 2 * kv_heads, dim] (the q heads are read); layer_kv [2 * kv_heads,
    num_slots, dim] (fp32 or fp16); key_slots [num_keys] int64 -> [num_tokens, heads * dim].
    `split`: the hybrid split where HYBRID says; off, every row goes the per-row way (`split_rule`)."""
    num_tokens, width, dim = qkv.shape
    num_kv_heads = layer_kv.shape[0] // 2
    assert width == num_heads + 2 * num_kv_heads and key_slots.dtype == torch.int64 and qkv.dtype == torch.float32
    out = torch.empty(num_tokens, num_heads * dim, dtype=torch.float32)
    lib = cpu_kernels.library()
    split_floats = lib.specray_attention_split_scratch(num_tokens, num_heads, num_kv_heads, dim, rows.new_mask.shape[1])
    scores = lib.specray_attention_score_floats(num_heads // num_kv_heads, rows.max_keys)  # per thread
    scratch = torch.empty(scores + split_floats, dtype=torch.float32)  # scores, then the split tasks'
    split_rule(split)
    (lib.specray_attention_f16 if _kv_half(layer_kv) else lib.specray_attention)(
        _ptr(qkv), width * dim, num_tokens, num_heads, num_kv_heads, dim, _ptr(layer_kv), layer_kv.shape[1],
        _ptr(key_slots), _ptr(rows.key_start), _ptr(rows.num_ctx), _ptr(rows.num_new), _ptr(rows.num_pad),
        _ptr(rows.new_mask), rows.new_mask.shape[1],
        scale, _ptr(out), _ptr(scratch), rows.max_keys, torch.get_num_threads())
    return out


def split_rule(split: bool) -> None:
    """Set where the C attention splits a sequence's rows (the hybrid path): where HYBRID says, or
    nowhere. A split row's bits differ from the per-row way's (the context and the round's keys are
    summed apart, then merged), and whether a row splits follows its sequence's rows in the step: a
    target whose rows must not depend on their step (`LlamaModel.row_invariant`) never splits."""
    lib = cpu_kernels.library()
    lib.specray_set_attention_split(HYBRID.c_min_context if split else NEVER_SPLIT["c_min_context"],
                                    HYBRID.c_min_rows, HYBRID.c_max_rows)


# -- every decoder layer in one call ----------------------------------------------------------------
@dataclass
class DecoderTable:
    """What `decoder_layers` reads of a model: its shapes and, per layer, the addresses of the packed
    projections (qkv, o, gate_up, down) and of the two norm weights. The owner keeps those alive."""

    dims: torch.Tensor  # int64 [6] hidden, heads, kv_heads, head_dim, intermediate, layers
    weights: torch.Tensor  # int64 [layers, 6] addresses: qkv, o, gate_up, down blocks; input, post norms
    kinds: torch.Tensor  # int32 [layers, 4] per projection: EXACT_KINDS, or FAST[parts] + FAST_KINDS in the fast layout
    eps: float
    scale: float
    split: bool = True  # the hybrid split attention where HYBRID says (the fast mode: never, see attention.c)

    FAST = {1: 8, 2: 16}  # csrc/decoder.c: q4_1 and q8_0 in fast_linear's layout from 8 (fast), 16 (fast16)

    @classmethod
    def kind(cls, packed) -> int:
        if isinstance(packed, FastWeight):
            return cls.FAST[packed.parts] + FAST_KINDS[packed.kind]
        return EXACT_KINDS[packed.kind]

    @classmethod
    def build(cls, c, layers, packed: list[list], scale: float) -> "DecoderTable":
        """From a model's (shard) config, its layers and their packed (qkv, o, gate_up, down) weights;
        weights in the fast layout turn the split off."""
        split = not any(isinstance(p, FastWeight) for ps in packed for p in ps)
        weights = [[p.blocks.data_ptr() for p in ps] + [layer.input_norm.data_ptr(), layer.post_attention_norm.data_ptr()]
                   for ps, layer in zip(packed, layers)]
        dims = [c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.num_layers]
        return cls(torch.tensor(dims), torch.tensor(weights, dtype=torch.int64),
                   torch.tensor([[cls.kind(p) for p in ps] for ps in packed], dtype=torch.int32),
                   c.rms_norm_eps, scale, split)

    def __post_init__(self):
        layers = int(self.dims[5])
        assert self.dims.shape == (6,) and self.dims.dtype == torch.int64
        assert self.weights.shape == (layers, 6) and self.weights.dtype == torch.int64
        assert self.kinds.shape == (layers, 4) and self.kinds.dtype == torch.int32

    @property
    def num_layers(self) -> int:
        return int(self.dims[5])


_SCRATCH = threading.local()  # per thread: an in-process draft may step beside the target


def decoder_logits(h: torch.Tensor, picked: torch.Tensor, norm: torch.Tensor, eps: float,
                   head: PackedWeight | FastWeight, features: bool = False):
    """After `decoder_layers`: the final norm of h's rows `picked` (int64 [n]) and the packed head,
    in one C call -> logits [n, vocab] fp32: the kernels `rms_norm` and the model's `linear` run on
    those rows, without their indexing, allocations and calls. With `features`, -> (logits, every
    row's norm [rows, hidden]): the features a feature-level draft reads, from the same call."""
    n, (rows, hidden) = picked.shape[0], h.shape
    assert picked.dtype == torch.int64 and head.in_features == hidden and norm.shape == (hidden,)
    lib = cpu_kernels.library()
    logits = torch.empty(n, head.out_features, dtype=torch.float32)  # [n, vocab]
    every = torch.empty(rows, hidden, dtype=torch.float32) if features else None  # [rows, hidden]
    work = workspace(lib.specray_decoder_logits_workspace(n, hidden))
    lib.specray_decoder_logits(_ptr(h), rows, _ptr(picked), n, hidden, _ptr(norm), eps, head.blocks.data_ptr(),
                               DecoderTable.kind(head), head.out_features, _ptr(logits),
                               None if every is None else _ptr(every), _ptr(work), torch.get_num_threads())
    return (logits, every) if features else logits


def workspace(floats: int) -> torch.Tensor:
    """Scratch of at least `floats` floats, kept between steps: a fresh one each step paid its page
    faults every step (about 7 % of a batch-1 decode's samples)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < floats:
        buf = _SCRATCH.buf = torch.empty(max(floats, 2 * (0 if buf is None else buf.numel())), dtype=torch.float32)
    return buf


def decoder_layers(h: torch.Tensor, table: DecoderTable, kv: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, slots: torch.Tensor, key_slots: torch.Tensor, rows: AttentionRows,
                   split: bool = True) -> None:
    """Every layer of a few-row step in one C call (`csrc/decoder.c`): h [num_tokens, hidden] holds the
    embedded tokens and becomes the residual stream after the last layer (before the final norm);
    the new tokens' KV goes into kv [layers, 2 * kv_heads, num_slots, head_dim]. Computes what the
    layer loop of `LlamaModel.forward` computes with the other fused ops."""
    num_tokens, hidden = h.shape
    assert kv.shape[0] == table.num_layers and kv.is_contiguous()
    assert hidden == int(table.dims[0]) and cos.shape == sin.shape == (num_tokens, kv.shape[3])
    assert slots.shape == (num_tokens,) and slots.dtype == key_slots.dtype == torch.int64
    lib = cpu_kernels.library()
    work = workspace(lib.specray_decoder_workspace(num_tokens, _ptr(table.dims), rows.max_keys))
    split_rule(split and table.split)
    lib.specray_decoder_layers(
        _ptr(h), num_tokens, _ptr(table.dims), table.eps, table.scale, _ptr(table.weights), _ptr(table.kinds),
        _ptr(kv), kv.stride(0), _kv_half(kv), kv.shape[2], _ptr(cos), _ptr(sin), _ptr(slots), _ptr(key_slots),
        _ptr(rows.key_start), _ptr(rows.num_ctx), _ptr(rows.num_new), _ptr(rows.num_pad), _ptr(rows.new_mask),
        rows.new_mask.shape[1], rows.max_keys, _ptr(work), torch.get_num_threads())
