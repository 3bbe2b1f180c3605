"""The model's recommended sampling defaults (vLLM's `--generation-config`): a request's options it
leaves unset take them instead of OpenAI's defaults.

"auto" (vLLM's default) reads the model folder's generation_config.json, a folder reads that
folder's, "vllm" takes none. Only temperature, top_k, top_p, min_p, repetition_penalty and
max_new_tokens (as max_tokens) are read, each only where it differs from Hugging Face's own default.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from specray.cluster.params import SamplingParams
from specray.kernels.config import generation_sampling

log = logging.getLogger("specray")

SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_tokens")


def sampling_defaults(generation_config: str, model_folder: Path | None) -> dict[str, Any]:
    """{field: value} for the fields above; ValueError names a bad setting or file."""
    if not isinstance(generation_config, str) or not generation_config:
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got {generation_config!r}")
    if generation_config == "vllm" or (generation_config == "auto" and model_folder is None):
        return {}
    folder = Path(model_folder if generation_config == "auto" else generation_config)
    path = folder / "generation_config.json"
    if generation_config != "auto" and not path.is_file():
        raise ValueError(f"generation_config: {path} does not exist ('auto': the model's; 'vllm': none)")
    defaults = generation_sampling(path)
    try:
        SamplingParams(**defaults)
    except ValueError as e:  # every request would be refused for a value no client sent
        raise ValueError(f"{path}: {e} (--generation-config vllm ignores the file)") from None
    if defaults:
        log.warning("default sampling parameters from %s: %s (a request's own values win; --generation-config "
                    "vllm: OpenAI's defaults)", path, defaults)
    return defaults


def default_params(defaults: dict[str, Any]) -> SamplingParams:
    """vLLM's LLM.get_default_sampling_params(): SamplingParams() with the model's defaults."""
    return SamplingParams(**defaults)
