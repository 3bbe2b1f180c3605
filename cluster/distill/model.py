"""The draft `specray distill` trains: a plain transformers `LlamaForCausalLM` with the target's
tokenizer, a smaller hidden size and a few layers, initialised from the target.

Initialisation: the target's embedding matrix E [vocab_size, H] gives an orthonormal basis
P [H, hidden] (its top right singular vectors); the draft's (tied) embedding is E P. Draft layer i
starts as target layer `source_layers[i]` seen through P: input projections W diag(g) P / c (the
RMSNorm weight g folded in, c the norm's rescaling), output projections P^T W. With hidden = H the
draft is exactly the selected target layers. Every other weight is the target's.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from specray.kernels.config import rope_params

VOCAB_TRIM_FILE = "vocab_trim.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model")


def evenly_spaced(num_target_layers: int, num_layers: int) -> list[int]:
    """Target layers a draft of `num_layers` starts from: the first, the last, and even steps between."""
    if num_layers == 1:
        return [0]
    return [round(i * (num_target_layers - 1) / (num_layers - 1)) for i in range(num_layers)]


def _mlp_keep(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` MLP neurons with the largest weight norms (in ascending index order)."""
    score = gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)
    return score.topk(size).indices.sort().values


def rope_theta(config) -> float:
    """RoPE base of a Llama config (transformers 4: rope_theta; 5: rope_parameters['rope_theta'])."""
    return rope_params(config)[0]


def draft_config(tc, hidden_size: int, num_layers: int, intermediate_size: int):
    """The draft's LlamaConfig: the target's heads, RoPE, norms and tokens, a smaller width and depth."""
    import inspect

    from transformers import LlamaConfig

    from specray.kernels.loader import llama_config

    if rope_params(tc)[1] is not None:
        raise ValueError("init from targets with RoPE scaling is not supported yet")
    theta = rope_theta(tc)
    rope = ({"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
            if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters else {"rope_theta": theta})
    config = llama_config(
        vocab_size=tc.vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps, tie_word_embeddings=True,
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id, **rope)
    config.architectures = ["LlamaForCausalLM"]
    assert rope_theta(config) == theta, "RoPE base lost in the draft config"
    return config


def init_draft(target_state: dict[str, torch.Tensor], target_config, hidden_size: int, num_layers: int,
               intermediate_size: int | None = None, source_layers: list[int] | None = None):
    """A draft `LlamaForCausalLM` (fp32) initialised from the target's weights (see module doc)."""
    from transformers import LlamaForCausalLM

    get = lambda n: target_state[n] if n in target_state else target_state[f"model.{n}"]  # noqa: E731
    tc = target_config
    big = tc.hidden_size
    if not 1 <= hidden_size <= big:
        raise ValueError(f"draft hidden_size must be in [1, {big}], got {hidden_size}")
    inter = intermediate_size or tc.intermediate_size
    if not 1 <= inter <= tc.intermediate_size:
        raise ValueError(f"draft intermediate_size must be in [1, {tc.intermediate_size}], got {inter}")
    source_layers = source_layers or evenly_spaced(tc.num_hidden_layers, num_layers)
    if len(source_layers) != num_layers or not all(0 <= s < tc.num_hidden_layers for s in source_layers):
        raise ValueError(f"need {num_layers} source layers in [0, {tc.num_hidden_layers}), got {source_layers}")
    config = draft_config(tc, hidden_size, num_layers, inter)
    emb = get("embed_tokens.weight").float()  # [vocab_size, H]
    if hidden_size == big:
        basis = torch.eye(big)
    else:
        basis = torch.linalg.svd(emb, full_matrices=False).Vh[:hidden_size].T  # [H, hidden]
    kept = (emb @ basis).pow(2).sum() / emb.pow(2).sum()  # fraction of the energy P keeps
    c = (hidden_size / (big * kept)).sqrt()  # rms(P^T h) / rms(h), roughly
    state = {"model.embed_tokens.weight": emb @ basis,
             "model.norm.weight": torch.diagonal(basis.T @ torch.diag(get("norm.weight").float()) @ basis) / c}
    for i, s in enumerate(source_layers):
        src, dst = f"layers.{s}.", f"model.layers.{i}."
        fold_in = lambda w, g: w.float() @ torch.diag(g.float()) @ basis / c  # noqa: E731
        g_in, g_post = get(src + "input_layernorm.weight"), get(src + "post_attention_layernorm.weight")
        for n in "qkv":
            state[dst + f"self_attn.{n}_proj.weight"] = fold_in(get(src + f"self_attn.{n}_proj.weight"), g_in)
        state[dst + "self_attn.o_proj.weight"] = basis.T @ get(src + "self_attn.o_proj.weight").float()
        gate, up, down = (get(src + f"mlp.{n}_proj.weight").float() for n in ("gate", "up", "down"))
        keep = _mlp_keep(gate, up, down, inter)
        state[dst + "mlp.gate_proj.weight"] = fold_in(gate[keep], g_post)
        state[dst + "mlp.up_proj.weight"] = fold_in(up[keep], g_post)
        state[dst + "mlp.down_proj.weight"] = basis.T @ down[:, keep]
        state[dst + "input_layernorm.weight"] = torch.ones(hidden_size)
        state[dst + "post_attention_layernorm.weight"] = torch.ones(hidden_size)
    draft = LlamaForCausalLM(config)
    missing, unexpected = draft.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    assert not unexpected and all("lm_head" in m or "rotary" in m for m in missing), (missing, unexpected)
    draft.tie_weights()
    return draft.float()


def write_draft_folder(folder: Path, weights: dict[str, torch.Tensor], config: dict, tokenizer_from: Path,
                       vocab_trim: dict[str, torch.Tensor] | None = None, files: dict[str, str] | None = None) -> Path:
    """Write a draft folder: model.safetensors, config.json, the tokenizer's files, the VocabTrim
    table and `files` (name -> text); atomic: written beside `folder`, then renamed over it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_from) / name).exists():
            shutil.copy(Path(tokenizer_from) / name, tmp / name)
    if vocab_trim is not None:
        save_file({k: v.contiguous() for k, v in vocab_trim.items()}, str(tmp / VOCAB_TRIM_FILE))
    for name, text in (files or {}).items():
        (tmp / name).write_text(text)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def save_draft(draft, folder: Path, tokenizer_from: Path, dtype: torch.dtype = torch.float16,
               vocab_trim: dict[str, torch.Tensor] | None = None, info: dict | None = None) -> Path:
    """Write an HF folder (config.json, model.safetensors in `dtype`, tokenizer files, the VocabTrim
    subset and `distill.json`)."""
    state = {k: v.to(dtype) for k, v in draft.state_dict().items() if k != "lm_head.weight"}
    config = draft.config.to_dict()
    config["torch_dtype"] = config["dtype"] = str(dtype).removeprefix("torch.")
    files = {"distill.json": json.dumps(info, indent=2)} if info is not None else None
    return write_draft_folder(folder, state, config, tokenizer_from, vocab_trim, files)


@dataclass
class TargetHead:
    """What a draft trained over the target's embedding and head reads of it."""

    embed: torch.Tensor  # [vocab, H] fp32
    head_full: torch.Tensor  # [vocab, H] the target's head (tied: the embedding)
    head: torch.Tensor  # [k, H] the VocabTrim rows the proposal uses, the training head
    table: dict[str, torch.Tensor]  # the VocabTrim table, ids by frequency in `samples`
    k: int


def target_head(state: dict[str, torch.Tensor], samples, eos: list[int], k: int) -> TargetHead:
    """The target's embedding and head, and a VocabTrim table of `samples` with its first k rows."""
    embed = state.get("model.embed_tokens.weight", state.get("embed_tokens.weight")).float()
    table = vocab_trim_table(vocab_trim_counts(samples, embed.shape[0]), eos)
    k = min(k, int(table["token_ids"].numel()))
    head_full = state.get("lm_head.weight", embed).float()
    return TargetHead(embed, head_full, head_full[table["token_ids"][:k].long()], table, k)


def vocab_trim_counts(samples, vocab_size: int) -> torch.Tensor:
    """Expected token frequency of target-generated text: every response position adds the teacher's
    probability of each of its top-k tokens (a smoothed count of the tokens the target emits)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in samples:
        counts.index_add_(0, s.top_ids.flatten().long(), s.top_logprobs.float().exp().flatten().double())
    return counts


def vocab_trim_table(counts: torch.Tensor, always: list[int]) -> dict[str, torch.Tensor]:
    """Token ids by descending frequency (`always` first: EOS and friends); a VocabTrim of size k
    keeps the first k. Tokens never seen are left out."""
    order = [t for t in always] + [t for t in counts.argsort(descending=True).tolist()
                                   if counts[t] > 0 and t not in set(always)]
    ids = torch.tensor(order, dtype=torch.int32)
    return {"token_ids": ids, "counts": counts[ids.long()].float()}


PARK_SCALES = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


@torch.no_grad()
def park_untrained_rows(draft, vocab: torch.Tensor, hidden: torch.Tensor) -> dict:
    """After training the head on `vocab` [k] only, the other rows of the (tied) embedding were never
    trained as outputs and outscore the trained ones for a full-vocabulary user (transformers'
    assisted generation). Park them at -a * r * mu, with mu the unit mean direction of the held-out
    final hidden states `hidden` [rows, hidden_size] (h . mu > 0 for nearly every h), r the trained
    rows' mean norm, and a the smallest of PARK_SCALES that keeps the full-vocabulary argmax equal to
    the subset argmax on >= 99.9 % of the rows (else the best). Those tokens then share one input
    embedding (they are rare: outside the k most frequent); VocabTrim users never propose them."""
    weight = draft.get_input_embeddings().weight  # [vocab_size, hidden_size], tied with the head
    inside = torch.zeros(weight.shape[0], dtype=torch.bool, device=weight.device)
    inside[vocab.to(weight.device)] = True
    h = hidden.float().to(weight.device)
    best_in = (h @ weight[inside].float().T).max(-1).values  # [rows]
    before = float(((h @ weight[~inside].float().T).max(-1).values < best_in).float().mean())
    mu = h.mean(0)
    mu = mu / mu.norm().clamp_min(1e-12)
    radius = weight[inside].float().norm(dim=1).mean()
    agreement = {a: float((-a * radius * (h @ mu) < best_in).float().mean()) for a in PARK_SCALES}
    good = [a for a in PARK_SCALES if agreement[a] >= 0.999]
    scale = good[0] if good else max(PARK_SCALES, key=lambda a: agreement[a])
    weight[~inside] = (-scale * radius * mu).to(weight.dtype)
    return {"scale": scale, "full_vocab_argmax_agreement_before": before,
            "full_vocab_argmax_agreement_after": agreement[scale]}
