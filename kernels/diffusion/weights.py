"""Load and save diffusion LM folders (config.json + *.safetensors) in the LLaDA and Dream layouts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from specray.kernels.config import UnsupportedModelError, with_generation_eos
from specray.kernels.diffusion.config import DiffusionConfig, diffusion_config
from specray.kernels.diffusion.model import DiffusionModel

# Per layout: (embedding, final norm, untied head, per-layer names). q, k and v (and gate, up) are
# separate tensors in both layouts; the runtime fuses them.
_TOP = {"llada": ("model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"),
        "dream": ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")}
_LAYER = {
    "llada": {"prefix": "model.transformer.blocks.{i}.", "attn_norm": "attn_norm.weight", "q": "q_proj", "k": "k_proj",
              "v": "v_proj", "o": "attn_out.weight", "ffn_norm": "ff_norm.weight", "gate": "ff_proj.weight",
              "up": "up_proj.weight", "down": "ff_out.weight"},
    "dream": {"prefix": "model.layers.{i}.", "attn_norm": "input_layernorm.weight", "q": "self_attn.q_proj",
              "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj.weight",
              "ffn_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight",
              "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight"},
}


def read_config(folder: str | Path) -> DiffusionConfig:
    path = Path(folder) / "config.json"
    if not path.exists():
        raise UnsupportedModelError(f"{folder} has no config.json")
    raw = json.loads(path.read_text())
    # an instruct model's end of turn may be only in generation_config.json, as for autoregressive ones
    raw["eos_token_id"] = with_generation_eos(raw.get("eos_token_id"), Path(folder) / "generation_config.json")
    return diffusion_config(raw)


def load_diffusion_model(folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> DiffusionModel:
    from safetensors.torch import load_file

    config = read_config(folder)
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{folder} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    model = DiffusionModel(config, dtype, device)
    load_state(model, state)
    return model.eval()


def load_state(model: DiffusionModel, state: dict[str, torch.Tensor]) -> None:
    """Copy a checkpoint's tensors (the model's layout names) into the runtime; a missing or
    mis-shaped tensor is an UnsupportedModelError naming it."""
    layout = model.config.layout
    get = _getter(state, layout)
    embed, norm, head = _TOP[layout]
    names = _LAYER[layout]
    with torch.no_grad():
        model.embed_tokens.copy_(get(embed, model.embed_tokens.shape))
        model.norm.copy_(get(norm, model.norm.shape))
        if model.lm_head is not model.embed_tokens:
            model.lm_head.copy_(get(head, model.lm_head.shape))
        for i, layer in enumerate(model.layers):
            p = names["prefix"].format(i=i)
            layer.attn_norm.copy_(get(p + names["attn_norm"], layer.attn_norm.shape))
            hidden = model.config.model.hidden_size
            layer.qkv_proj.copy_(torch.cat([get(p + names[n] + ".weight", (rows, hidden))
                                            for n, rows in zip("qkv", _qkv_sizes(model))]))
            if layer.qkv_bias is not None:
                # a Dream folder without biases (ours, trained without) means zero biases
                layer.qkv_bias.copy_(torch.cat([state.get(p + names[n] + ".bias", torch.zeros(s)) for n, s in
                                                zip("qkv", _qkv_sizes(model))]))
            layer.o_proj.copy_(get(p + names["o"], layer.o_proj.shape))
            layer.ffn_norm.copy_(get(p + names["ffn_norm"], layer.ffn_norm.shape))
            half = (layer.gate_up_proj.shape[0] // 2, hidden)
            layer.gate_up_proj.copy_(torch.cat([get(p + names["gate"], half), get(p + names["up"], half)]))
            layer.down_proj.copy_(get(p + names["down"], layer.down_proj.shape))


def _qkv_sizes(model: DiffusionModel) -> tuple[int, int, int]:
    c = model.config.model
    return c.q_size, c.kv_size, c.kv_size


def _getter(state: dict[str, torch.Tensor], layout: str) -> Callable[..., torch.Tensor]:
    def get(name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in state:
            raise UnsupportedModelError(f"the {layout} checkpoint has no tensor {name!r}")
        t = state[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise UnsupportedModelError(f"{name} has shape {tuple(t.shape)}, the config implies {tuple(shape)}")
        return t
    return get


def dream_state(model: DiffusionModel, dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """The model's tensors under Dream's names (how specray saves the DLLMs it trains)."""
    names, (embed, norm, head) = _LAYER["dream"], _TOP["dream"]
    out = {embed: model.embed_tokens, norm: model.norm}
    if model.lm_head is not model.embed_tokens:
        out[head] = model.lm_head
    for i, layer in enumerate(model.layers):
        p = names["prefix"].format(i=i)
        for n, w in zip("qkv", layer.qkv_proj.split(_qkv_sizes(model))):
            out[p + names[n] + ".weight"] = w
        if layer.qkv_bias is not None:
            for n, b in zip("qkv", layer.qkv_bias.split(_qkv_sizes(model))):
                out[p + names[n] + ".bias"] = b
        gate, up = layer.gate_up_proj.chunk(2)
        out.update({p + names["attn_norm"]: layer.attn_norm, p + names["o"]: layer.o_proj,
                    p + names["ffn_norm"]: layer.ffn_norm, p + names["gate"]: gate, p + names["up"]: up,
                    p + names["down"]: layer.down_proj})
    return {k: v.detach().to(dtype).contiguous() for k, v in out.items()}
