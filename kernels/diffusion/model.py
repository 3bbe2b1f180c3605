"""A bidirectional Llama-family transformer over ragged batches of whole canvases.

A diffusion LM sees its whole canvas (prompt, decided tokens and masks) at every step, each position
attending every other, so there is no KV cache to reuse between steps: a step is one forward over the
canvas. `forward` runs many canvases in one call (flat rows, attention per canvas, no padding between
them); `reference_logits` is the float64 specification the fast path must match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specray.kernels import invariant
from specray.kernels.diffusion.config import DiffusionConfig
from specray.kernels.rope import RotaryTable, apply_rotary

# FreeDave's exactness rests on row independence: a canvas forwarded alone or among drafts gives
# bit-identical logits (tests check it). A forward pads its rows to a multiple of ROW_TILE: MKL's fp32
# GEMM changes the last bits of a few rows when the row count is below 12 or off a multiple of 4.
# Elsewhere (16-bit weights, a GPU) the library picks its algorithm by the shape, so projections run
# at kernels/invariant.py's fixed shapes; and on a CPU the SiLU runs on one thread (invariant.silu_mul).
ROW_TILE = 16


class DiffusionLayer(nn.Module):
    def __init__(self, config: DiffusionConfig):
        super().__init__()
        c = config.model
        qkv_rows = c.q_size + 2 * c.kv_size
        self.attn_norm = nn.Parameter(torch.ones(c.hidden_size))  # [hidden_size]
        self.qkv_proj = nn.Parameter(torch.empty(qkv_rows, c.hidden_size))  # [q+2kv, hidden_size]
        self.qkv_bias = nn.Parameter(torch.zeros(qkv_rows)) if config.qkv_bias else None  # [q+2kv]
        self.o_proj = nn.Parameter(torch.empty(c.hidden_size, c.q_size))
        self.ffn_norm = nn.Parameter(torch.ones(c.hidden_size))
        self.gate_up_proj = nn.Parameter(torch.empty(2 * c.intermediate_size, c.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(c.hidden_size, c.intermediate_size))


class DiffusionModel(nn.Module):
    def __init__(self, config: DiffusionConfig, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        super().__init__()
        c = config.model
        self.config = config
        self.embed_tokens = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size))  # [vocab_size, hidden_size]
        self.layers = nn.ModuleList(DiffusionLayer(config) for _ in range(c.num_layers))
        self.norm = nn.Parameter(torch.ones(c.hidden_size))
        self.lm_head = (self.embed_tokens if c.tie_word_embeddings
                        else nn.Parameter(torch.empty(c.vocab_size, c.hidden_size)))
        self.to(dtype=dtype, device=device)
        self.rotary = RotaryTable(c, dtype, device)
        self.fixed_shapes = not (self.device.type == "cpu" and dtype == torch.float32)  # see ROW_TILE

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def max_len(self) -> int:
        return self.config.model.max_position_embeddings

    @torch.inference_mode()
    def forward(self, canvases: list[torch.Tensor], windows: list[tuple[int, int] | torch.Tensor]) -> list[torch.Tensor]:
        """canvases: token ids [length_i] each; windows: the positions whose logits to return, a range
        (start_i, end_i) or positions [n_i]. -> logits [n_i, vocab_size] (fp32) per canvas, in order."""
        assert len(canvases) == len(windows) and canvases
        windows = [torch.arange(w[0], w[1]) if isinstance(w, tuple) else w for w in windows]
        lengths = [int(c.shape[0]) for c in canvases]
        num_tokens = sum(lengths)
        ids = torch.cat(canvases).to(self.device)  # [num_tokens]
        positions = torch.cat([torch.arange(n, device=self.device) for n in lengths])  # [num_tokens]
        cos, sin = self.rotary.lookup(positions)
        h = invariant.pad_rows(self.embed_tokens[ids], ROW_TILE)  # [padded_tokens, hidden_size]
        for layer in self.layers:
            h = self._layer(layer, h, num_tokens, lengths, cos, sin)
        rows = self._window_rows(lengths, windows)  # [num_logits]
        logits = self._linear(invariant.pad_rows(self._norm(h[rows], self.norm), ROW_TILE), self.lm_head)
        return list(logits[: rows.shape[0]].float().split([int(w.shape[0]) for w in windows]))

    @property
    def eps(self) -> float:
        return self.config.model.rms_norm_eps

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, in] -> [rows, out], each row's bits whatever the other rows (x padded to ROW_TILE)."""
        if not self.fixed_shapes:
            return F.linear(x, weight, bias)
        y = invariant.linear(x, weight)  # [rows, out]
        return y if bias is None else y + bias

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm of x [rows, hidden]; at fixed shapes where a reduction's order may follow the row count."""
        return invariant.rms_norm(x, weight, self.eps) if self.fixed_shapes else _rms_norm(x, weight, self.eps)

    def _window_rows(self, lengths: list[int], windows: list[torch.Tensor]) -> torch.Tensor:
        """Flat hidden rows whose logits the windows ask for (one row earlier with shifted logits)."""
        shift = 1 if self.config.shift_logits else 0
        starts, rows = 0, []
        for n, w in zip(lengths, windows):
            assert w.numel() == 0 or (int(w.min()) >= shift and int(w.max()) < n), \
                f"positions outside a canvas of {n} (shift {shift})"
            rows.append(w + (starts - shift))
            starts += n
        return torch.cat(rows).to(self.device)

    def _layer(self, layer: DiffusionLayer, h: torch.Tensor, num_tokens: int, lengths: list[int],
               cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config.model
        qkv = self._linear(self._norm(h, layer.attn_norm), layer.qkv_proj, layer.qkv_bias)[:num_tokens]
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = apply_rotary(q.view(num_tokens, c.num_heads, c.head_dim), cos, sin)
        k = apply_rotary(k.view(num_tokens, c.num_kv_heads, c.head_dim), cos, sin)
        v = v.view(num_tokens, c.num_kv_heads, c.head_dim)
        attn = torch.cat([_full_attention(qi, ki, vi) for qi, ki, vi in
                          zip(q.split(lengths), k.split(lengths), v.split(lengths))])  # [num_tokens, q_size]
        h = h + self._linear(invariant.pad_rows(attn, ROW_TILE), layer.o_proj)
        gate, up = self._linear(self._norm(h, layer.ffn_norm), layer.gate_up_proj).chunk(2, dim=-1)
        return h + self._linear(invariant.silu_mul(gate, up), layer.down_proj)

    def reference_logits(self, canvas: torch.Tensor) -> torch.Tensor:
        """canvas [length] -> logits [length, vocab_size] in float64, one canvas, plain math: the
        specification `forward` is tested against. Row i predicts position i (shift applied;
        with shifted logits row 0 repeats row 1's source and is never asked for)."""
        c, f64 = self.config.model, torch.float64
        n = canvas.shape[0]
        pos = torch.arange(n)
        cos, sin = self.rotary.cos[pos].to(f64).unsqueeze(1), self.rotary.sin[pos].to(f64).unsqueeze(1)
        h = self.embed_tokens.detach().to(f64)[canvas]
        for layer in self.layers:
            w = {name: p.detach().to(f64) for name, p in layer.named_parameters()}
            x = _rms_norm(h, w["attn_norm"], self.eps) @ w["qkv_proj"].T + w.get("qkv_bias", 0.0)
            q, k, v = x.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q = apply_rotary(q.view(n, c.num_heads, c.head_dim), cos, sin).transpose(0, 1)
            group = c.num_heads // c.num_kv_heads
            k = apply_rotary(k.view(n, c.num_kv_heads, c.head_dim), cos, sin).transpose(0, 1).repeat_interleave(group, 0)
            v = v.view(n, c.num_kv_heads, c.head_dim).transpose(0, 1).repeat_interleave(group, 0)
            probs = (q @ k.transpose(1, 2) * c.head_dim ** -0.5).softmax(-1)  # [heads, length, length]
            h = h + (probs @ v).transpose(0, 1).reshape(n, c.q_size) @ w["o_proj"].T
            gate, up = (_rms_norm(h, w["ffn_norm"], self.eps) @ w["gate_up_proj"].T).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ w["down_proj"].T
        logits = _rms_norm(h, self.norm.detach().to(f64), self.eps) @ self.lm_head.detach().to(f64).T
        return torch.cat([logits[:1], logits[:-1]]) if self.config.shift_logits else logits


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One canvas, no mask: q [length, heads, head_dim], k/v [length, kv_heads, head_dim] -> [length, q_size]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         enable_gqa=q.shape[1] != k.shape[1])  # [heads, length, head_dim]
    return out.transpose(0, 1).reshape(q.shape[0], -1)
