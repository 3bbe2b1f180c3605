"""Diffusion LM configuration, read from the config.json of LLaDA-style and Dream-style folders.

Both layouts are a Llama-family transformer without a causal mask plus a mask token. They differ in
names and in one rule: Dream predicts position i from the hidden state at i - 1 (logits shifted right
by one, as its autoregressive initialisation left it); LLaDA predicts position i from position i.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specray.kernels.config import ModelConfig, UnsupportedModelError

LAYOUTS = ("llada", "dream")
_MODEL_TYPES = {"llada": "llada", "dream": "dream"}  # config.json model_type (lower case) -> layout


@dataclass(frozen=True)
class DiffusionConfig:
    model: ModelConfig  # the transformer's shapes (attention is bidirectional whatever it says)
    layout: str  # "llada" | "dream": weight names and the logits shift
    mask_token_id: int
    qkv_bias: bool  # Dream (Qwen2) projects q, k and v with biases

    def __post_init__(self) -> None:
        assert self.layout in LAYOUTS
        assert 0 <= self.mask_token_id < self.model.vocab_size, "the mask token must be in the vocabulary"

    @property
    def shift_logits(self) -> bool:
        """Position i's logits come from the hidden state at i - 1."""
        return self.layout == "dream"


def diffusion_layout(raw: dict[str, Any]) -> str | None:
    """The layout of a raw config.json dict, or None for a model that is not a diffusion LM."""
    return _MODEL_TYPES.get(str(raw.get("model_type", "")).lower())


def is_diffusion_folder(folder: str | Path) -> bool:
    """Whether a checkpoint folder's config.json names a diffusion LM layout."""
    path = Path(folder) / "config.json"
    return path.exists() and diffusion_layout(json.loads(path.read_text())) is not None


def diffusion_config(raw: dict[str, Any]) -> DiffusionConfig:
    """Parse a raw config.json dict; an unsupported variant is an UnsupportedModelError naming why."""
    layout = diffusion_layout(raw)
    if layout is None:
        raise UnsupportedModelError(f"model_type {raw.get('model_type')!r} is not a diffusion LM "
                                    f"(supported layouts: {', '.join(LAYOUTS)})")
    if raw.get("mask_token_id") is None:
        raise UnsupportedModelError(f"a {layout} config needs mask_token_id")
    model = _llada_shapes(raw) if layout == "llada" else _dream_shapes(raw)
    return DiffusionConfig(model, layout, int(raw["mask_token_id"]), qkv_bias=layout == "dream")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UnsupportedModelError(message)


def _eos(raw: dict[str, Any]) -> tuple[int, ...]:
    eos = raw.get("eos_token_id")
    return tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))


def _llada_shapes(raw: dict[str, Any]) -> ModelConfig:
    # LLaDA keeps OLMo's names: d_model, n_heads, mlp_hidden_size, weight_tying, ...
    _require(raw.get("block_type", "llama") == "llama", f"LLaDA block_type {raw.get('block_type')!r} (llama only)")
    _require(raw.get("activation_type", "silu") in ("silu", "swiglu"),
             f"LLaDA activation_type {raw.get('activation_type')!r} (silu only)")
    _require(raw.get("layer_norm_type", "rms") == "rms", f"LLaDA layer_norm_type {raw.get('layer_norm_type')!r} (rms)")
    for flag in ("alibi", "include_bias", "include_qkv_bias", "input_emb_norm", "scale_logits", "attention_layer_norm"):
        _require(not raw.get(flag, False), f"LLaDA {flag}=True is not supported")
    _require(raw.get("rope", True), "LLaDA without RoPE is not supported")
    hidden, heads = int(raw["d_model"]), int(raw["n_heads"])
    vocab = int(raw.get("embedding_size") or raw["vocab_size"])
    return ModelConfig(
        vocab_size=vocab, hidden_size=hidden,
        intermediate_size=int(raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * hidden),
        num_layers=int(raw["n_layers"]), num_heads=heads, num_kv_heads=int(raw.get("n_kv_heads") or heads),
        head_dim=hidden // heads, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        max_position_embeddings=int(raw.get("max_sequence_length", 4096)),
        tie_word_embeddings=bool(raw.get("weight_tying", False)), eos_token_ids=_eos(raw),
        bos_token_id=raw.get("bos_token_id"))


def _dream_shapes(raw: dict[str, Any]) -> ModelConfig:
    # Dream keeps Qwen2's names.
    _require(raw.get("hidden_act", "silu") == "silu", f"Dream hidden_act {raw.get('hidden_act')!r} (silu only)")
    _require(not raw.get("use_sliding_window", False), "Dream with a sliding window is not supported")
    _require(not raw.get("rope_scaling"), "Dream with rope_scaling is not supported")
    heads = int(raw["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=float(raw.get("rope_theta", 10000.0)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), eos_token_ids=_eos(raw),
        bos_token_id=raw.get("bos_token_id"))
