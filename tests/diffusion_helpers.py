"""Tiny seeded diffusion LMs written in the LLaDA and Dream folder layouts (no downloads).

Each is built from a transformers model (Llama for LLaDA, Qwen2 for Dream) whose weights are renamed
into the layout, so transformers run without a causal mask is an independent check of the runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import save_word_tokenizer

VOCAB, MASK = 97, 96  # the last id is the mask token
SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0)


def hf_twin(layout: str, seed: int = 0, scale: float = 3.0, **overrides):
    """The transformers model a tiny `layout` DLLM is saved from (random, seeded, peaky)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    kw = {**SHAPES, "vocab_size": VOCAB, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
          **overrides}
    model = (LlamaForCausalLM(LlamaConfig(**kw)) if layout == "llada" else Qwen2ForCausalLM(Qwen2Config(**kw)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(scale if "bias" not in name else 1.0)
            if "bias" in name:
                p.normal_(0.0, 0.5)
    return model.eval()


def save_tiny_dllm(folder: Path, layout: str = "llada", seed: int = 0, scale: float = 3.0, **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    model = hf_twin(layout, seed, scale, **overrides)
    c = model.config
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if layout == "llada":
        state = _llada_names(state, c.num_hidden_layers)
        config = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": c.hidden_size,
                  "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads,
                  "n_layers": c.num_hidden_layers, "mlp_hidden_size": c.intermediate_size,
                  "vocab_size": c.vocab_size, "embedding_size": c.vocab_size, "max_sequence_length": 512,
                  "rms_norm_eps": c.rms_norm_eps, "rope_theta": 10000.0, "weight_tying": False,
                  "mask_token_id": MASK, "eos_token_id": 2, "pad_token_id": 2, "block_type": "llama",
                  "activation_type": "silu", "layer_norm_type": "rms", "include_bias": False}
    else:
        config = {**c.to_dict(), "model_type": "Dream", "architectures": ["DreamModel"], "mask_token_id": MASK}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_word_tokenizer(folder, VOCAB)
    return folder


def _llada_names(state: dict, layers: int) -> dict:
    out = {"model.transformer.wte.weight": state["model.embed_tokens.weight"],
           "model.transformer.ln_f.weight": state["model.norm.weight"],
           "model.transformer.ff_out.weight": state["lm_head.weight"]}
    rename = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "q_proj.weight",
              "self_attn.k_proj.weight": "k_proj.weight", "self_attn.v_proj.weight": "v_proj.weight",
              "self_attn.o_proj.weight": "attn_out.weight", "post_attention_layernorm.weight": "ff_norm.weight",
              "mlp.gate_proj.weight": "ff_proj.weight", "mlp.up_proj.weight": "up_proj.weight",
              "mlp.down_proj.weight": "ff_out.weight"}
    for i in range(layers):
        for src, dst in rename.items():
            out[f"model.transformer.blocks.{i}.{dst}"] = state[f"model.layers.{i}.{src}"]
    return out


def bidirectional_logits(model, ids: torch.Tensor, shift: bool) -> torch.Tensor:
    """transformers' logits [length, vocab] of `ids` [length] with no causal mask (a 4D all-visible mask)."""
    n = ids.shape[0]
    mask = torch.zeros(1, 1, n, n)
    with torch.no_grad():
        logits = model(input_ids=ids.unsqueeze(0), attention_mask=mask).logits[0].double()
    return torch.cat([logits[:1], logits[:-1]]) if shift else logits
