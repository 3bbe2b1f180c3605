"""The feature-level draft `specray distill --kind eagle` trains (EAGLE-style): it reads the target's
own last hidden state instead of re-deriving it from tokens, which is why it agrees with the target
far more often than a standalone draft of the same cost.

Input at position i: fc([f_i; E x_{i+1}]) with f_i the target's final (post-norm) hidden state at i
and E the target's embedding; one Llama decoder layer and an RMSNorm then give g_{i+1}, the
predicted f_{i+1}; the target's LM head on g_{i+1} is the proposal for x_{i+2}. Drafting further,
g replaces f. The decoder layer is a plain transformers `LlamaModel` with one layer, so the draft
loads in transformers; the embedding and the head are the target's and are not stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specray.cluster.distill.model import draft_config, write_draft_folder
from specray.kernels.drafters.eagle import EAGLE_FILE


class EagleDraft(nn.Module):
    """fc + one Llama decoder layer + RMSNorm (module doc). Training runs it over whole sequences."""

    def __init__(self, config):
        super().__init__()
        from transformers import LlamaModel

        h = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * h, h, bias=False)  # [feature; embedding] -> the layer's input
        self.model = LlamaModel(config)  # its embed_tokens is unused: inputs come through fc
        self.model.embed_tokens.requires_grad_(False)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """features, embeds [B, L, H]; mask [B, L] -> predicted next features [B, L, H]."""
        x = self.fc(torch.cat([features, embeds], dim=-1))
        return self.model(inputs_embeds=x, attention_mask=mask).last_hidden_state

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


def init_eagle(target_state: dict[str, torch.Tensor], target_config, feature_rms: float = 1.0) -> EagleDraft:
    """A draft that starts by predicting g_{i+1} = f_i: fc passes the feature through, the layer
    (the target's last) has its output projections zeroed, so the residual stream is f_i, and the
    final norm's weight is the features' RMS (`feature_rms`), which undoes the norm's rescaling.
    The target's head on f_i is a sane (if one-off) proposal, a far better start than noise."""
    tc = target_config
    config = draft_config(tc, tc.hidden_size, 1, tc.intermediate_size)
    draft = EagleDraft(config)
    last = f"layers.{tc.num_hidden_layers - 1}."
    state = {k.removeprefix("model.").removeprefix(last): v.float() for k, v in target_state.items()
             if k.removeprefix("model.").startswith(last)}
    with torch.no_grad():
        draft.model.layers[0].load_state_dict(state)
        layer = draft.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        draft.model.norm.weight.fill_(feature_rms)
        h = tc.hidden_size
        draft.fc.weight.copy_(torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1))
        draft.model.embed_tokens.weight.zero_()
    return draft.float()


def load_eagle_draft(name: str, target_config) -> EagleDraft:
    """An earlier feature-level draft (alias or folder) to continue training; it must read features
    of the target's width, or its fc cannot take them."""
    from safetensors.torch import load_file

    from specray.kernels.drafters.eagle import is_eagle_folder
    from specray.kernels.loader import hf_config, resolve

    folder = resolve(name).path
    if not is_eagle_folder(folder):
        raise ValueError(f"--init-from {name}: {folder} is not a feature-level (eagle) draft")
    config = hf_config(folder)
    if config.hidden_size != target_config.hidden_size or config.vocab_size != target_config.vocab_size:
        raise ValueError(f"--init-from {name}: hidden size {config.hidden_size} / vocabulary {config.vocab_size} "
                         f"differ from the target's {target_config.hidden_size} / {target_config.vocab_size}")
    draft = EagleDraft(config)
    state = {k: v.float() for k, v in load_file(str(Path(folder) / "model.safetensors")).items()}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"model.embed_tokens.weight"}:
        raise ValueError(f"--init-from {name}: weights do not fit (missing {missing}, unexpected {unexpected})")
    return draft.float()


def save_eagle(draft: EagleDraft, folder: Path, target: str, tokenizer_from: Path,
               vocab_trim: dict[str, torch.Tensor] | None = None, info: dict | None = None,
               dtype: torch.dtype = torch.float16) -> Path:
    """Write config.json, model.safetensors (fc and the layer, no embedding), eagle.json, tokenizer
    files and the VocabTrim table."""
    state = {k: v.to(dtype) for k, v in draft.state_dict().items() if "embed_tokens" not in k and "rotary" not in k}
    config = draft.config.to_dict()
    config["torch_dtype"] = config["dtype"] = str(dtype).removeprefix("torch.")
    config["architectures"] = ["LlamaModel"]
    marker = {EAGLE_FILE: json.dumps({"target": target, **(info or {})}, indent=2)}
    return write_draft_folder(folder, state, config, tokenizer_from, vocab_trim, marker)
