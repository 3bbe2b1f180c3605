"""LongSpec draft folders and options: `longspec.json` names the target a draft was trained for and
its window; a target of other shapes, or a window past the context, is refused with the reason."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specray.kernels.config import ModelConfig
from specray.kernels.drafters.longspec_model import LongSpecLayer

LONGSPEC_FILE = "longspec.json"  # marks a folder as a LongSpec draft: its target, window, training record


@dataclass(frozen=True)
class LongSpecOptions:
    """speculative_config['longspec']: `window` overrides the draft's trained self-attention window."""

    window: int | None = None

    def __post_init__(self) -> None:
        w = self.window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise ValueError(f"longspec window must be an integer >= 1, got {w!r}")

    @classmethod
    def from_dict(cls, raw: dict | None) -> "LongSpecOptions":
        if raw is not None and not isinstance(raw, dict):
            raise ValueError(f"longspec must be a mapping such as {{'window': 512}}, got {raw!r}")
        raw = dict(raw or {})
        unknown = sorted(set(raw) - {"window"})
        if unknown:
            raise ValueError(f"unknown longspec options {unknown}; known: ['window']")
        return cls(**raw)


def is_longspec_folder(folder: Path) -> bool:
    return (Path(folder) / LONGSPEC_FILE).exists()


def longspec_info(folder: Path) -> dict:
    return json.loads((Path(folder) / LONGSPEC_FILE).read_text())


def pairing_error(draft: ModelConfig, target: ModelConfig) -> str | None:
    """Why a LongSpec draft trained over `draft`'s shapes cannot serve `target`, or None."""
    keys = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size", "rope_theta")
    diff = [f"{k} {getattr(draft, k)} != {getattr(target, k)}" for k in keys if getattr(draft, k) != getattr(target, k)]
    return None if not diff else "the LongSpec draft's target shapes differ from this target's: " + ", ".join(diff)


def load_longspec(folder: Path, window: int | None = None, dtype: torch.dtype = torch.float32,
                  device: str = "cpu") -> tuple[LongSpecLayer, torch.Tensor, torch.Tensor]:
    """The folder's layer (window: its trained one unless given) and its target's embedding and head
    [vocab_size, hidden] each; a target of other shapes is a clear error."""
    from safetensors.torch import load_file

    from specray.kernels.loader import _read_safetensors, hf_config, resolve

    folder = Path(folder)
    info = longspec_info(folder)
    config = ModelConfig.from_hf(hf_config(folder))
    target = resolve(info["target"]).path
    error = pairing_error(config, ModelConfig.from_hf(hf_config(target)))
    if error:
        raise ValueError(f"{folder} was trained for {info['target']!r}: {error}")
    layer = LongSpecLayer(config, int(window or info["window"]), dtype, device)
    state = load_file(str(folder / "model.safetensors"))
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(state[name])
    weights = _read_safetensors(target)
    embed = weights.get("model.embed_tokens.weight", weights.get("embed_tokens.weight"))
    head = weights.get("lm_head.weight", embed)
    return layer.eval().requires_grad_(False), embed.to(dtype=dtype, device=device), head.to(dtype=dtype, device=device)


def check_pairing(draft: str, target: ModelConfig, options: dict | None, max_model_len: int) -> None:
    """Refuse a LongSpec draft whose shapes do not fit the served target, or a window past its context."""
    from specray.kernels.loader import hf_config, resolve

    folder = resolve(draft).path
    if not is_longspec_folder(folder):
        raise ValueError(f"{draft!r} is not a LongSpec draft (no {LONGSPEC_FILE}); method 'longspec' needs one")
    error = pairing_error(ModelConfig.from_hf(hf_config(folder)), target)
    if error:
        raise ValueError(f"{draft!r} cannot draft for this target: {error}")
    window = LongSpecOptions.from_dict(options).window or longspec_info(folder)["window"]
    if window > max_model_len:
        raise ValueError(f"longspec window {window} exceeds the context (max_model_len {max_model_len})")
