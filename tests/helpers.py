"""Tiny seeded Llama checkpoints for tests (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    kw = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(overrides)
    return LlamaConfig(**kw)


def save_tiny_llama(folder: Path, seed: int = 0, perturb_from: Path | None = None,
                    noise: float = 0.0, head_scale: float = 1.0, **overrides) -> Path:
    """Save a random fp32 Llama to `folder` (HF layout). With `perturb_from`, copy that model's
    weights and add seeded Gaussian noise, so a draft agrees with its target only partly."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    if perturb_from is not None:
        model = LlamaForCausalLM.from_pretrained(perturb_from, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p) * p.std().clamp_min(1e-3))
    else:
        model = LlamaForCausalLM(tiny_llama_config(**overrides))
        with torch.no_grad():  # larger weights give peaky, less uniform distributions
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.mul_(4.0 * (head_scale if name == "lm_head.weight" else 1.0))
    model.save_pretrained(folder, safe_serialization=True)
    save_word_tokenizer(folder, model.config.vocab_size)
    return folder


def save_word_tokenizer(folder: Path, vocab_size: int) -> None:
    """A real (word-level) tokenizer over words w3..w{vocab-1}, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tok.chat_template = "{% for m in messages %}w3 {{ m['content'] }} w4 {% endfor %}w5"
    tok.save_pretrained(folder)
