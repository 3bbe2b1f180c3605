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


def gguf_exact(w: torch.Tensor, kind: str = "q4_1") -> torch.Tensor:
    """Round w [out, in] (in % 32 == 0) to values a GGUF Q4_1 or Q8_0 block holds exactly, the way a
    dequantised GGUF checkpoint looks. Each Q4_1 block gets q = 0 and q = 15 (as llama.cpp's min/max
    rounding gives), so the blocks are recoverable from the fp32 values."""
    blocks = w.detach().reshape(w.shape[0], -1, 32)  # [out, nb, 32]
    if kind == "q8_0":
        d = (blocks.abs().amax(-1, keepdim=True) / 127).half().float()
        q = (blocks / d.clamp_min(1e-8)).round().clamp(-127, 127)
        return (d * q).reshape(w.shape)
    m = blocks.amin(-1, keepdim=True).half().float()
    d = ((blocks.amax(-1, keepdim=True) - m) / 15).half().float().clamp_min(1e-4)
    q = ((blocks - m) / d).round().clamp(0, 15)
    q[..., 0], q[..., 1] = 0, 15
    return (d * q + m).reshape(w.shape)


def save_tiny_llama(folder: Path, seed: int = 0, perturb_from: Path | None = None,
                    noise: float = 0.0, head_scale: float = 1.0, gguf: bool = False, bf16: bool = False,
                    **overrides) -> Path:
    """Save a random fp32 Llama to `folder` (HF layout). With `perturb_from`, copy that model's
    weights and add seeded Gaussian noise, so a draft agrees with its target only partly. `gguf`
    rounds the projections to Q4_1 and the embeddings to Q8_0 values (as a dequantised GGUF);
    `bf16` saves the weights in bf16, as most Hugging Face checkpoints are."""
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
    if gguf:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.copy_(gguf_exact(p, "q8_0" if "embed" in name or "lm_head" in name else "q4_1"))
    if bf16:
        model = model.to(torch.bfloat16)
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


def text_after(tokenizer, prompt_ids: list[int], ids: list[int], skip_special_tokens: bool = True) -> str:
    """What `ids` read as after the prompt (a first word's leading space included), as vLLM's text."""
    head = tokenizer.decode(prompt_ids, skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(prompt_ids + ids, skip_special_tokens=skip_special_tokens)[len(head):]
