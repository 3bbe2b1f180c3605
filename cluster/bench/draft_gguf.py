"""A standalone draft (a transformers Llama folder) written as a GGUF file that llama.cpp loads beside
its target, for the `llama-speculative-simple` rows of `specray bench offline` (benchmarks only).

llama.cpp drafts only with a model that shares its target's vocabulary, so the tokenizer's fields are
copied from the target's GGUF; the weights keep the checkpoint's values (fp16 or fp32 matrices, fp32
norms). llama.cpp's `llama` rotary embedding pairs neighbouring dimensions where transformers pairs
dimension i with i + head_dim / 2, so the query and key rows are reordered within each head."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

FORMAT = 1  # bumps the cache key when what is written changes

# transformers' names -> GGUF's, per layer ("{i}") and global
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}


def rope_rows_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    """[heads * head_dim, in] rows in transformers' rotate-half order -> llama.cpp's pairwise order:
    row (h, half, j) moves to (h, j, half)."""
    out_dim = w.shape[0]
    assert out_dim % (2 * heads) == 0, (out_dim, heads)
    return w.reshape(heads, 2, out_dim // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _config(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{folder}: a llama.cpp draft must be a Llama checkpoint, got model_type "
                         f"{config.get('model_type')!r}")
    if config.get("rope_scaling") or config.get("attention_bias") or config.get("mlp_bias"):
        raise ValueError(f"{folder}: rope scaling and biases are not written to the draft's GGUF")
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    return config


def _gguf_tensors(folder: Path, config: dict) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from specray.kernels.drafters.vocab_trim import VOCAB_TRIM_FILE

    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        if file.name != VOCAB_TRIM_FILE:  # VocabTrim's table is specray's, not the model's
            state.update(load_file(file))
    rope_heads = {"self_attn.q_proj.weight": config["num_attention_heads"],
                  "self_attn.k_proj.weight": config["num_key_value_heads"]}
    out = {}
    for name, w in state.items():
        if name in _GLOBAL_NAMES:
            out[_GLOBAL_NAMES[name]] = w
            continue
        parts = name.split(".")  # model.layers.{i}.<rest>
        rest = ".".join(parts[3:])
        if parts[:2] != ["model", "layers"] or rest not in _LAYER_NAMES:
            raise ValueError(f"{folder}: unexpected tensor {name!r} for a Llama draft")
        out[f"blk.{parts[2]}.{_LAYER_NAMES[rest]}"] = rope_rows_interleaved(w, rope_heads[rest]) \
            if rest in rope_heads else w
    if config.get("tie_word_embeddings", False):
        out.pop("output.weight", None)  # llama.cpp reads a missing head as the embedding
    return out


def write_draft_gguf(folder: str | Path, target_gguf: str | Path, out: str | Path) -> Path:
    """The draft checkpoint `folder` as a GGUF file at `out`, with the tokenizer of `target_gguf`."""
    import gguf

    folder, out = Path(folder), Path(out)
    config = _config(folder)
    target = gguf.GGUFReader(str(target_gguf))
    vocab = len(target.fields["tokenizer.ggml.tokens"].contents())
    if config["vocab_size"] != vocab:
        raise ValueError(f"{folder}: vocabulary {config['vocab_size']} differs from the target's {vocab}")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(folder.name)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(vocab)
    tensors = _gguf_tensors(folder, config)
    half = any(w.dtype == torch.float16 and w.dim() == 2 for w in tensors.values())
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if half else gguf.LlamaFileType.ALL_F32)
    for key, field in target.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)
    for name in sorted(tensors):
        w = tensors[name]
        # matrices keep 16 bits (bf16 has no lossless fp16 form: it widens to fp32); norms are fp32
        dtype = np.float16 if w.dim() == 2 and w.dtype == torch.float16 else np.float32
        writer.add_tensor(name, w.float().numpy().astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def cached_draft_gguf(folder: str | Path, target_gguf: str | Path) -> Path:
    """write_draft_gguf into specray's cache, once per draft, target and FORMAT."""
    from specray.kernels.loader import cache_root

    folder, target_gguf = Path(folder), Path(target_gguf)
    digest = hashlib.sha256(f"{FORMAT} {target_gguf.resolve()} {target_gguf.stat().st_size}".encode())
    for file in sorted(folder.glob("*.safetensors")) + [folder / "config.json"]:
        digest.update(file.read_bytes())
    out = cache_root() / "llama.cpp" / "drafts" / f"{folder.name}-{digest.hexdigest()[:16]}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        write_draft_gguf(folder, target_gguf, partial)
        partial.rename(out)
    return out
