"""EasySpec's fuzzy (layer-parallel) drafting (arXiv 2502.02493): the draft's middle layers run in
groups of N consecutive layers whose attention sublayers all read the hidden state entering the
group, so the N attentions could run at once (on N devices); the MLPs stay sequential.

Our reading of how the group's attention outputs enter the residual stream (the paper leaves it
open; docs/speculation.md): with h0 the state entering the group,
    h = h0;  for each layer i of the group:  h += Attn_i(norm_i(h0));  h += MLP_i(post_norm_i(h))
The first and last layers stay alone (sequential). N = 1 is ordinary drafting.

The KV a fuzzy step writes is approximate (its keys and values come from h0): the drafter drops it
after every round and rewrites it with one exact sequential pass over the committed tokens (bonus
calibration), so the error never accumulates. Proposals carry the fuzzy draft's own probabilities,
so verification, and the output, stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specray.kernels.attention import build_attention_mask, is_causal_prefill, ragged_attention
from specray.kernels.batch import RaggedBatch
from specray.kernels.kv_cache import PagedKVCache
from specray.kernels.tp_group import TPGroup


@dataclass(frozen=True)
class LayerGroups:
    """A partition of the draft's layers into runs of consecutive layers, in order."""

    groups: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        flat = [i for g in self.groups for i in g]
        assert flat == list(range(len(flat))) and all(self.groups), "groups must cover the layers in order"

    @classmethod
    def uniform(cls, num_layers: int, size: int) -> "LayerGroups":
        """The middle layers in runs of `size` (the last run may be shorter); first and last alone."""
        middle = num_layers - 2
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"layer_parallel must be an integer >= 1, got {size!r}")
        if size > 1 and size > middle:
            raise ValueError(f"layer_parallel {size} exceeds the draft's {max(middle, 0)} middle layers "
                             f"({num_layers} layers, the first and last stay sequential)")
        runs = [tuple(range(s, min(s + size, num_layers - 1))) for s in range(1, num_layers - 1, size)]
        return cls(((0,), *runs, (num_layers - 1,)) if num_layers > 1 else ((0,),))

    @property
    def size(self) -> int:
        return max(len(g) for g in self.groups)

    @property
    def sequential_steps(self) -> int:
        """Attention sublayers one draft token waits on in turn (num_layers when sequential)."""
        return len(self.groups)


class FuzzyForward:
    """The fuzzy forward of one LlamaModel: pure torch, the group's Q/K/V projections one matmul
    over the shared input (each layer's input-norm weight folded into its columns).

    Across devices (`workers`, a TPGroup of W ranks that all run every call): member j of a group
    runs its attention on rank j % W only, which alone writes and reads that layer's fuzzy KV; the
    outputs are all-gathered in rank order, so every rank continues with the same bits as one
    process. Every rank computes the group's whole Q/K/V matmul: it is what keeps those bits equal."""

    def __init__(self, model, groups: LayerGroups, workers: TPGroup | None = None):
        assert groups.groups[-1][-1] == len(model.layers) - 1, "the groups must cover the draft's layers"
        self.model, self.groups, self.workers = model, groups, workers or TPGroup()
        with torch.no_grad():  # [sum over the group (q_size + 2 kv_size), hidden_size]
            self.folded = [torch.cat([model.layers[i].qkv_proj * model.layers[i].input_norm for i in g])
                           for g in groups.groups]

    @torch.inference_mode()
    def __call__(self, batch: RaggedBatch, cache: PagedKVCache) -> torch.Tensor:
        """Like LlamaModel.forward (writes the new tokens' KV) -> logits [num_logits, vocab_size] (fp32)."""
        model = self.model
        h = model.embed_tokens[batch.input_ids]  # [num_tokens, hidden_size]
        context = _Context(batch, model)
        for group, folded in zip(self.groups.groups, self.folded, strict=True):
            h = self._group(h, group, folded, batch, cache, context)
        h = model.norm_rows(h[batch.logits_indices], model.norm, False)
        return model.linear(h, model.lm_head).float()

    def _group(self, h, group, folded, batch, cache, context) -> torch.Tensor:
        c, model = self.model.shard_config, self.model
        unit = F.rms_norm(h, (h.shape[-1],), None, model.config.rms_norm_eps)  # h0 / rms(h0)
        width = c.q_size + 2 * c.kv_size
        qkv_all = F.linear(unit, folded)  # [num_tokens, len(group) * width]
        w = self.workers
        mine = [self._attention(qkv_all[:, j * width:(j + 1) * width], i, batch, cache, context)
                for j, i in enumerate(group) if j % w.size == w.rank]  # independent: one device each
        attention = mine if w.size == 1 else self._gather(mine, len(group), h.shape[0])
        for i, attn in zip(group, attention, strict=True):  # the MLPs run in order
            layer = model.layers[i]
            h = h + model.linear(attn, layer.o_proj)
            x = model.norm_rows(h, layer.post_attention_norm, False)
            gate, up = model.linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            h = h + model.linear(F.silu(gate) * up, layer.down_proj)
        return h

    def _gather(self, mine: list[torch.Tensor], members: int, num_tokens: int) -> list[torch.Tensor]:
        """Each rank's attention outputs [num_tokens, q_size] -> the group's, in member order."""
        w, q_size = self.workers, self.model.shard_config.q_size
        per_rank = -(-members // w.size)  # a short group pads with zeros: every rank sends one shape
        pad = [self.model.embed_tokens.new_zeros(num_tokens, q_size)] * (per_rank - len(mine))
        every = w.all_gather_last_dim(torch.cat(mine + pad, dim=1))  # [num_tokens, size * per_rank * q_size]
        every = every.view(num_tokens, w.size, per_rank, q_size)
        return [every[:, j % w.size, j // w.size] for j in range(members)]

    def _attention(self, qkv, i, batch, cache, context) -> torch.Tensor:
        """Layer i's attention of qkv [num_tokens, q_size + 2 kv_size]; writes its K/V -> [num_tokens, q_size]."""
        c = self.model.shard_config
        qkv = qkv.reshape(-1, c.num_heads + 2 * c.num_kv_heads, c.head_dim)
        qk = torch.bmm(qkv[:, : c.num_heads + c.num_kv_heads], context.rot)  # RoPE on q and k at once
        new_kv = torch.cat([qk[:, c.num_heads:], qkv[:, c.num_heads + c.num_kv_heads:]], dim=1)
        layer_kv = cache.kv[i]  # [2 * num_kv_heads, num_slots, head_dim]
        layer_kv.index_copy_(1, batch.slot_mapping, new_kv.transpose(0, 1).to(layer_kv.dtype))
        kv = layer_kv.index_select(1, batch.key_slots).to(qk.dtype)  # a fast-mode draft's cache is fp16
        attn = ragged_attention(qk[:, : c.num_heads], kv, context.mask, self.model.scale, context.causal)
        return attn.reshape(attn.shape[0], -1)


class _Context:
    """What every layer's attention of one step shares."""

    def __init__(self, batch: RaggedBatch, model):
        self.rot = model.rotary.rotation(batch.positions)  # [num_tokens, head_dim, head_dim]
        self.mask = build_attention_mask(batch)
        self.causal = is_causal_prefill(batch)
