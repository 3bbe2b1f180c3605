"""Rotary position embeddings (Llama's rotate-half layout), including linear and llama3 scaling."""

from __future__ import annotations

import math

import torch

from specray.kernels.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """[head_dim // 2] inverse frequencies after the configured scaling."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if scaling is None or scaling["rope_type"] == "default":
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    return _llama3_scaling(inv_freq, scaling)


def _llama3_scaling(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate the band between.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(in_band, smoothed, scaled)


class RotaryTable:
    """Precomputed cos/sin for every position up to the model's context length."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu"):
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float64)
        freqs = torch.outer(positions, inverse_frequencies(config))  # [max_pos, head_dim // 2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [max_pos, head_dim]
        self.cos = emb.cos().to(dtype=dtype, device=device)
        self.sin = emb.sin().to(dtype=dtype, device=device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [num_tokens] -> cos, sin [num_tokens, 1, head_dim] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def rotation(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [num_tokens] -> [num_tokens, head_dim, head_dim] matrices R with
        x @ R == apply_rotary(x, cos, sin): one batched matmul per layer instead of seven ops."""
        cos, sin = self.cos[positions], self.sin[positions]  # [num_tokens, head_dim]
        half = cos.shape[-1] // 2
        rot = torch.diag_embed(cos)
        idx = torch.arange(half, device=cos.device)
        # rotate_half(x)[i] = -x[i + half] for i < half, x[i - half] otherwise
        rot[:, idx + half, idx] = -sin[:, :half]
        rot[:, idx, idx + half] = sin[:, half:]
        return rot


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, heads, head_dim]; cos/sin [num_tokens, 1, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
