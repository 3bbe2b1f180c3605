"""The LongSpec draft layer (arXiv 2502.17421): one decoder layer whose memory does not grow with
the context.

    h = E[x_i]
    h += SelfAttn(norm(h)) over the last `window` positions (a fixed ring buffer at run time)
    h += CrossAttn(norm(h)) over the target's last-layer keys and values at positions <= i - lag
    h += MLP(norm(h))
    logits = head(norm(h))

E and the head are the target's, frozen. The cross-attention's query is rotated at its own position,
as the target's post-RoPE keys expect, and it attends one zero key/value besides the target's (an
attention sink: a row with no target key yet outputs 0 instead of NaN, in training and serving
alike). `dense_forward` is the reference: every position of whole sequences with dense masks (what
training runs); the drafter (longspec.py) computes the same rows from its ring buffer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specray.kernels.config import ModelConfig
from specray.kernels.rope import RotaryTable, apply_rotary

PARAMETERS = ("input_norm", "qkv_proj", "o_proj", "cross_norm", "cross_q_proj", "cross_o_proj", "post_norm",
              "gate_up_proj", "down_proj", "norm")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, sink: bool) -> torch.Tensor:
    """q [B, N, H, D]; k, v [B, M, K, D]; visible [B or 1, N, M] bool -> [B, N, H * D]. With `sink`, one
    zero key and value every row sees (rows with no visible key give 0)."""
    b, n, heads, dim = q.shape
    if sink:
        zero = k.new_zeros(k.shape[0], 1, *k.shape[2:])
        k, v = torch.cat([zero, k], 1), torch.cat([zero, v], 1)  # [B, 1 + M, K, D]
        visible = torch.cat([visible.new_ones(*visible.shape[:2], 1), visible], -1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=visible.unsqueeze(1), enable_gqa=heads != k.shape[2])
    return out.transpose(1, 2).reshape(b, n, heads * dim)  # [B, N, H * D]


def window_mask(n: int, window: int, device=None) -> torch.Tensor:
    """[n, n] bool: index i sees j when i - window < j <= i (causal, sliding)."""
    i = torch.arange(n, device=device)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)


def lag_mask(n: int, m: int, lag: int, device=None) -> torch.Tensor:
    """[n, m] bool: index i sees target position j when j <= i - lag."""
    return torch.arange(m, device=device)[None, :] <= torch.arange(n, device=device)[:, None] - lag


class LongSpecLayer(nn.Module):
    """The draft's parameters over a target's shapes (`config`: the target's ModelConfig)."""

    def __init__(self, config: ModelConfig, window: int, dtype: torch.dtype = torch.float32, device="cpu"):
        super().__init__()
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"the LongSpec window must be an integer >= 1, got {window!r}")
        if window > config.max_position_embeddings:
            raise ValueError(f"the LongSpec window {window} exceeds the target's context "
                             f"{config.max_position_embeddings}")
        self.config, self.window = config, window
        c, hid = config, config.hidden_size
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

        def param(*shape, ones=False):
            return nn.Parameter((torch.ones if ones else torch.zeros)(*shape, dtype=dtype, device=device))

        self.input_norm, self.cross_norm, self.post_norm, self.norm = (param(hid, ones=True) for _ in range(4))
        self.qkv_proj, self.o_proj = param(q + 2 * kv, hid), param(hid, q)
        self.cross_q_proj, self.cross_o_proj = param(q, hid), param(hid, q)
        self.gate_up_proj, self.down_proj = param(2 * c.intermediate_size, hid), param(hid, c.intermediate_size)
        self.rotary = RotaryTable(config, dtype, device)

    def rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.config.rms_norm_eps)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B, N, heads, D]; positions [B, N] -> rotated at those positions."""
        cos, sin = self.rotary.cos[positions].unsqueeze(-2), self.rotary.sin[positions].unsqueeze(-2)
        return apply_rotary(x, cos, sin)

    def self_qkv(self, emb: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """emb [B, N, hidden]; positions [B, N] -> q [B, N, H, D], k, v [B, N, K, D] (q and k rotated)."""
        c = self.config
        qkv = F.linear(self.rms(emb, self.input_norm), self.qkv_proj)
        q, k, v = qkv.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1)
        shape = (*emb.shape[:2], -1, c.head_dim)
        return self.rotate(q.reshape(shape), positions), self.rotate(k.reshape(shape), positions), v.reshape(shape)

    def finish(self, emb: torch.Tensor, self_out: torch.Tensor, positions: torch.Tensor, cross_k: torch.Tensor,
               cross_v: torch.Tensor, cross_visible: torch.Tensor, sink_included: bool = False) -> torch.Tensor:
        """The rest of the layer after self-attention: emb [B, N, hidden]; self_out [B, N, H * D];
        cross_k, cross_v [B, M, K, D] (the target's, post-RoPE; with `sink_included`, row 0 is
        already the zero sink, visible to every row); cross_visible [B or 1, N, M] -> the
        final-normed hidden state [B, N, hidden] the head reads."""
        c = self.config
        h = emb + F.linear(self_out, self.o_proj)
        q = F.linear(self.rms(h, self.cross_norm), self.cross_q_proj).reshape(*h.shape[:2], c.num_heads, c.head_dim)
        h = h + F.linear(attend(self.rotate(q, positions), cross_k, cross_v,
                                cross_visible, sink=not sink_included), self.cross_o_proj)
        gate, up = F.linear(self.rms(h, self.post_norm), self.gate_up_proj).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, self.down_proj)
        return self.rms(h, self.norm)

    def dense_forward(self, emb: torch.Tensor, positions: torch.Tensor, cross_k: torch.Tensor,
                      cross_v: torch.Tensor, lag: int) -> torch.Tensor:
        """Reference over whole sequences: emb [B, S, hidden]; positions [B, S]; the target's last-layer
        cross_k, cross_v [B, S, K, D] at the same indices; index i reads target indices <= i - lag
        -> hidden [B, S, hidden]."""
        s = emb.shape[1]
        q, k, v = self.self_qkv(emb, positions)
        self_out = attend(q, k, v, window_mask(s, self.window, emb.device).unsqueeze(0), sink=False)
        return self.finish(emb, self_out, positions, cross_k, cross_v, lag_mask(s, s, lag, emb.device).unsqueeze(0))

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())
