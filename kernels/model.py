"""Llama-family decoder over ragged batches with a paged KV cache.

RMSNorm, RoPE (with scaling), GQA, SwiGLU, tied or untied LM head. Projections are fused
(qkv, gate_up) so that a decode step is few large GEMVs, which is what bounds CPU speed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from specray.kernels import cpu_ops, invariant
from specray.kernels.attention import (
    batch_attention,
    build_attention_mask,
    is_causal_prefill,
    plan_batch_attention,
    ragged_attention,
)
from specray.kernels.attention_reference import reference_attention
from specray.kernels.batch import RaggedBatch
from specray.kernels.config import ModelConfig
from specray.kernels.cpu_weights import CpuWeights
from specray.kernels.fast_linear import FastWeight, fast_linear
from specray.kernels.kernel_modes import FAST_PARTS
from specray.kernels.kv_cache import PagedKVCache
from specray.kernels.quant_linear import PackedWeight, packed_linear
from specray.kernels.rope import RotaryTable
from specray.kernels.tp_group import TPGroup

SPLIT_ROWS = 1024  # weight rows per call for 4..12-row CPU steps (see LlamaModel.linear)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.input_norm = nn.Parameter(torch.ones(c.hidden_size))  # [hidden_size]
        self.post_attention_norm = nn.Parameter(torch.ones(c.hidden_size))  # [hidden_size]
        self.qkv_proj = nn.Parameter(torch.empty(c.q_size + 2 * c.kv_size, c.hidden_size))
        self.o_proj = nn.Parameter(torch.empty(c.hidden_size, c.q_size))
        self.gate_up_proj = nn.Parameter(torch.empty(2 * c.intermediate_size, c.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(c.hidden_size, c.intermediate_size))


class LlamaModel(CpuWeights, nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        super().__init__()
        self.config = config  # the whole model, whatever this process holds
        # Shapes this process holds: heads, KV heads and intermediate size of its tensor-parallel
        # shard (vocab_size stays the full logits width). Equal to `config` without TP.
        self.shard_config = config
        self.tp_group = TPGroup()
        self.vocab_parallel = False  # lm_head holds this rank's vocab rows; logits are all-gathered
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.lm_head = (self.embed_tokens if config.tie_word_embeddings
                        else nn.Parameter(torch.empty(config.vocab_size, config.hidden_size)))
        self.to(dtype=dtype, device=device)
        self.rotary = RotaryTable(config, dtype, device)
        self.scale = config.head_dim ** -0.5
        self.gemv_weights: dict[int, torch.Tensor] = {}  # id(weight) -> weight.T contiguous
        self.packed_weights: dict[int, PackedWeight | FastWeight] = {}  # id(weight) -> its Q4_1/Q8_0 blocks
        self.kernel_mode = "exact"  # "fast" / "fast16": the fast layout, 8-bit / two-part activations (fast_linear), fp16 KV
        self.fused_cpu_ops = False  # norms and RoPE through the C ops (`enable_cpu_kernels`)
        self.native_layers = True  # every layer in one C call where `decoder_table` applies
        # a row's bits do not depend on its step (kernels/invariant.py): the C kernels are built so;
        # elsewhere library kernels run at fixed shapes. Off for drafts, whose numbers only shape proposals.
        self.row_invariant = True
        # (packed_weights it was built from, the table or None): rebuilt when packed_weights is replaced
        self._decoder_table: tuple[dict, cpu_ops.DecoderTable | None] = ({}, None)

    def projections(self) -> list[torch.Tensor]:
        """Every weight a step reads through `linear`."""
        return [self.lm_head] + [w for layer in self.layers
                                 for w in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [rows, in] @ weight [out, in]^T -> [rows, out].

        Packed weights (exact blocks or the fast layout) always take their C kernel: a row's numbers
        must not depend on the step's size (a decode row beside another sequence's prefill, a
        verification of many rows). Other weights run in fixed-row chunks (`invariant.linear`: MKL's
        and cuBLAS's algorithm, and with it a row's bits, follow the row count), except where
        `row_invariant` is off (drafts): there `gemv_weights` give a GEMV copy for one row and,
        for 4..12 rows, SPLIT_ROWS-row slices of the weight (MKL packs the whole weight for those
        row counts, slower than slices that fit in L2; docs/performance.md).
        """
        rows = x.shape[0]
        packed = self.packed_for(weight)
        if isinstance(packed, FastWeight):
            return fast_linear(x, packed)
        if packed is not None:
            return packed_linear(x, packed)
        if self.row_invariant:
            return invariant.linear(x, weight)
        if not self.gemv_weights or 1 < rows < 4 or rows > 12:
            return F.linear(x, weight)
        if rows == 1:
            wt = self.gemv_weights.get(id(weight))
            return F.linear(x, weight) if wt is None else x @ wt
        if weight.shape[0] <= SPLIT_ROWS:
            return F.linear(x, weight)
        return torch.cat([F.linear(x, w) for w in weight.split(SPLIT_ROWS)], dim=1)

    def packed_for(self, weight: torch.Tensor) -> PackedWeight | FastWeight | None:
        """The packed blocks `linear` runs `weight` on; None where it takes torch."""
        return self.packed_weights.get(id(weight)) if self.packed_weights else None

    def packed_head(self) -> PackedWeight | FastWeight | None:
        """`packed_for` the head, whole on this rank; else None."""
        return None if self.vocab_parallel else self.packed_for(self.lm_head)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        """The KV cache's: fp16 in the fast modes, whose every step reads it through the C attention
        (which widens it to fp32 as it loads: half the bytes a decode row's attention reads, and
        half the memory a token's KV takes); the model's own dtype otherwise."""
        return torch.float16 if self.kernel_mode in FAST_PARTS and self.fused_cpu_ops else self.dtype

    def make_cache(self, num_blocks: int, block_size: int = 16, prefix_caching: bool = False) -> PagedKVCache:
        return PagedKVCache(self.shard_config, num_blocks, block_size, dtype=self.kv_dtype,
                            device=self.embed_tokens.device, prefix_caching=prefix_caching)

    @torch.inference_mode()
    def forward(self, batch: RaggedBatch, cache: PagedKVCache, reference: bool = False,
                inputs_embeds: torch.Tensor | None = None, features: bool = False):
        """Run one step; writes the new tokens' KV into `cache`. -> logits [num_logits, vocab_size] (fp32),
        and with `features` also every row's final (post-norm) hidden state [num_tokens, hidden_size],
        which feature-level drafts read. `inputs_embeds` [num_tokens, hidden_size] replaces the
        embedding lookup.

        Steps with packed weights run every layer in one C call, prefill included; otherwise the
        layers run op by op (`layer_loop`); `reference` is pure torch on the fp32 weights."""
        fused = self.fused_cpu_ops and not reference  # C ops for norms, RoPE and attention (see cpu_ops)
        # one C attention call per layer, prefill included: its rows do not depend on the step
        rows = cpu_ops.AttentionRows.build(batch) if fused else None
        if inputs_embeds is None:
            h = self.embed_tokens[batch.input_ids]  # [num_tokens, hidden_size]
        else:
            assert inputs_embeds.shape == (batch.num_tokens, self.config.hidden_size)
            h = inputs_embeds.to(self.dtype, copy=True).contiguous()  # the C layers write the residual stream into h
        table = self.decoder_table() if rows is not None else None
        if table is not None and len(self.layers) == cache.kv.shape[0]:
            cos, sin = self.rotary.cos[batch.positions], self.rotary.sin[batch.positions]  # [num_tokens, head_dim]
            cpu_ops.decoder_layers(h, table, cache.kv, cos, sin, batch.slot_mapping, batch.key_slots, rows,
                                   split=not self.row_invariant)
            head = self.packed_head()
            if head is not None:  # the final norm and the head (and the features) in the same C kernels, one call
                return cpu_ops.decoder_logits(h, batch.logits_indices, self.norm, self.config.rms_norm_eps, head,
                                              features)
        else:
            h = self.layer_loop(batch, cache, h, rows, reference)
        fixed = self.row_invariant and not reference  # the norm's chunks (the C norm is row-wise anyway)
        if features:  # RMSNorm is per row: the logits rows are bit-identical either way
            every = self.norm_rows(h, self.norm, fused, fixed)  # [num_tokens, hidden_size]
            h = every[batch.logits_indices]
        else:
            h = self.norm_rows(h[batch.logits_indices], self.norm, fused, fixed)
        logits = (F.linear if reference else self.linear)(h, self.lm_head)  # [num_logits, vocab_size / tp_size if vocab_parallel]
        if self.vocab_parallel:
            logits = self.tp_group.all_gather_last_dim(logits)
        return (logits.float(), every) if features else logits.float()

    def layer_loop(self, batch: RaggedBatch, cache: PagedKVCache, h: torch.Tensor,
                   rows: cpu_ops.AttentionRows | None, reference: bool) -> torch.Tensor:
        """h [num_tokens, hidden_size] embedded -> the residual stream after the last layer, op by op."""
        c, tp = self.shard_config, self.tp_group
        if self.row_invariant and not reference and not self.fused_cpu_ops:  # every op at fixed shapes
            return invariant.layer_loop(self, batch, cache, h)
        fused = self.fused_cpu_ops and not reference
        linear = F.linear if reference else self.linear  # the reference reads the fp32 weights
        if fused:
            cos, sin = self.rotary.cos[batch.positions], self.rotary.sin[batch.positions]  # [num_tokens, head_dim]
        else:
            rot = self.rotary.rotation(batch.positions)  # [num_tokens, head_dim, head_dim]
        plan = (plan_batch_attention(batch) if not reference and rows is None and batch.batch_size > 1
                else None)
        mask = None if reference or rows is not None or plan is not None else build_attention_mask(batch)
        causal = is_causal_prefill(batch)
        context_len = batch.context_lens[0] if batch.batch_size == 1 and not batch.key_pads else None
        x = self.norm_rows(h, self.layers[0].input_norm, fused)
        for i, layer in enumerate(self.layers):
            qkv = linear(x, layer.qkv_proj).view(-1, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
            layer_kv = cache.kv[i]  # [2 * num_kv_heads, num_slots, head_dim]
            if fused:  # RoPE on q and k in place, k and v into the cache
                cpu_ops.rope_store_kv(qkv, cos, sin, batch.slot_mapping, layer_kv, c.num_heads)
                q = qkv[:, : c.num_heads]
            else:
                qk = torch.bmm(qkv[:, : c.num_heads + c.num_kv_heads], rot)  # RoPE on q and k at once
                new_kv = torch.cat([qk[:, c.num_heads:], qkv[:, c.num_heads + c.num_kv_heads:]], dim=1)
                layer_kv.index_copy_(1, batch.slot_mapping, new_kv.transpose(0, 1).to(layer_kv.dtype))
                q = qk[:, : c.num_heads]
            if rows is not None:
                attn = cpu_ops.attention(qkv, c.num_heads, layer_kv, batch.key_slots, rows, self.scale,
                                         split=not self.row_invariant)
            elif plan is not None:
                attn = batch_attention(q, layer_kv, plan, self.scale)
            else:
                if batch.key_range is not None:
                    kv = layer_kv[:, batch.key_range[0]:batch.key_range[1]]  # [2 * num_kv_heads, num_keys, head_dim]
                else:
                    kv = layer_kv.index_select(1, batch.key_slots)
                kv = kv.to(q.dtype)  # a 16-bit cache (the fast mode) read by the reference
                attn = (reference_attention(q, kv, batch, self.scale) if reference
                        else ragged_attention(q, kv, mask, self.scale, causal, context_len))
            o = tp.all_reduce(linear(attn, layer.o_proj))  # partial sums over head groups
            h, x = self.add_norm(h, o, layer.post_attention_norm, fused)
            gate, up = linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            down = tp.all_reduce(linear(F.silu(gate) * up, layer.down_proj))
            if i + 1 < len(self.layers):
                h, x = self.add_norm(h, down, self.layers[i + 1].input_norm, fused)
            else:
                h = h + down
        return h

    def norm_rows(self, h: torch.Tensor, weight: torch.Tensor, fused: bool, fixed: bool = False) -> torch.Tensor:
        """RMSNorm of h [rows, hidden_size]; `fixed`: in fixed-shape chunks (kernels/invariant.py)."""
        eps = self.config.rms_norm_eps
        if fused:
            return cpu_ops.rms_norm(h, weight, eps)
        return invariant.rms_norm(h, weight, eps) if fixed else cpu_ops.rms_norm_reference(h, weight, eps)

    def add_norm(self, h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add and the next norm: -> (h + delta, RMSNorm of it); fused updates h in place."""
        if fused:
            return h, cpu_ops.add_rms_norm(h, delta, weight, self.config.rms_norm_eps)
        h = h + delta
        return h, self.norm_rows(h, weight, False)

    # -- weights ----------------------------------------------------------------------------
    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy Hugging Face Llama weights (fusing q/k/v and gate/up); layers past num_layers are ignored."""
        get = lambda name: state[name] if name in state else state[f"model.{name}"]  # noqa: E731
        with torch.no_grad():
            self.embed_tokens.copy_(get("embed_tokens.weight"))
            self.norm.copy_(get("norm.weight"))
            if not self.config.tie_word_embeddings:
                self.lm_head.copy_(state["lm_head.weight"])
            for i, layer in enumerate(self.layers):
                p = f"layers.{i}."
                layer.input_norm.copy_(get(p + "input_layernorm.weight"))
                layer.post_attention_norm.copy_(get(p + "post_attention_layernorm.weight"))
                layer.qkv_proj.copy_(torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"]))
                layer.o_proj.copy_(get(p + "self_attn.o_proj.weight"))
                layer.gate_up_proj.copy_(torch.cat([get(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]))
                layer.down_proj.copy_(get(p + "mlp.down_proj.weight"))
