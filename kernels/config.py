"""Model configuration for the Llama-family runtime, converted once from a Hugging Face config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one the runtime implements."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        assert self.num_heads % self.num_kv_heads == 0, "GQA needs num_heads divisible by num_kv_heads"
        assert self.num_layers >= 1 and self.vocab_size >= 1 and self.head_dim >= 2
        assert self.head_dim % 2 == 0, "RoPE rotates pairs of dimensions"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf: Any) -> "ModelConfig":
        """Build from a transformers `PretrainedConfig` (or anything with the same attributes)."""
        model_type = getattr(hf, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported; specray runs the Llama family "
                f"({', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        for flag in ("attention_bias", "mlp_bias"):
            if getattr(hf, flag, False):
                raise UnsupportedModelError(f"{flag}=True is not supported by the Llama runtime")
        if getattr(hf, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {hf.hidden_act!r} is not supported (silu only)")
        theta, rope_scaling = rope_params(hf)
        rope_scaling = _check_rope_scaling(rope_scaling)
        num_heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
        eos = getattr(hf, "eos_token_id", None)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=theta,
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            rope_scaling=rope_scaling,
            eos_token_ids=eos_ids,
            bos_token_id=getattr(hf, "bos_token_id", None),
        )


def rope_params(hf) -> tuple[float, dict[str, Any] | None]:
    """(RoPE base, scaling or None) of an HF config. transformers 4 keeps `rope_theta` and
    `rope_scaling`; 5 keeps both in `rope_parameters` (and `rope_scaling` aliases it), with no
    `rope_theta` attribute: reading only that would silently fall back to the default base."""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    theta = params.pop("rope_theta", None) or getattr(hf, "rope_theta", None) or 10000.0
    if params.get("rope_type", params.get("type", "default")) == "default":
        params = {k: v for k, v in params.items() if k not in ("rope_type", "type")}
    return float(theta), params or None


def _check_rope_scaling(rope_scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    if not rope_scaling:
        return None
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(f"rope scaling {rope_type!r} is not supported ({SUPPORTED_ROPE_TYPES})")
    return {**rope_scaling, "rope_type": rope_type}


# Hugging Face GenerationConfig's defaults of the sampling fields vLLM takes from generation_config.json:
# a field that holds its default is no recommendation of the model's (transformers' to_diff_dict)
HF_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0,
                        "max_new_tokens": None}


def generation_sampling(folder: Path) -> dict[str, Any]:
    """The sampling defaults a model folder recommends, as vLLM reads them: its generation_config.json,
    else its config.json (transformers' GenerationConfig.from_model_config), max_new_tokens as
    max_tokens; {} with neither. ValueError: a file that cannot be read as a JSON object."""
    path = next((folder / name for name in ("generation_config.json", "config.json") if (folder / name).is_file()),
                None)
    if path is None:
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a JSON object")
    return {"max_tokens" if name == "max_new_tokens" else name: raw[name]
            for name, default in HF_SAMPLING_DEFAULTS.items() if raw.get(name) is not None and raw[name] != default}


def with_generation_eos(eos, generation_config: Path):
    """config.json's eos_token_id and those of generation_config.json beside it (an instruct model's
    end of turn is often only there: Llama 3's <|eot_id|>), as vLLM stops at both."""
    ids = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos])
    if generation_config.exists():
        more = json.loads(generation_config.read_text()).get("eos_token_id")
        more = more if isinstance(more, list) else ([] if more is None else [more])
        ids += [i for i in more if isinstance(i, int) and i not in ids]
    return ids[0] if len(ids) == 1 else (ids or eos)
