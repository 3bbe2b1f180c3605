"""The model's recommended sampling defaults (vLLM's `--generation-config`): a request's options it
leaves unset take them instead of OpenAI's defaults.

"auto" (vLLM's default) reads the model folder's generation_config.json (else its config.json), a
folder reads that folder's, "vllm" takes none. Only temperature, top_k, top_p, min_p,
repetition_penalty and max_new_tokens (as max_tokens) are read, each only where it differs from
Hugging Face's own default; do_sample is not (nor in vLLM). A request's own values always win.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from specray.cluster.params import SamplingParams
from specray.kernels.config import generation_sampling

log = logging.getLogger("specray")

def sampling_defaults(generation_config: str | os.PathLike, model_folder: Path,
                      diffusion: bool = False) -> dict[str, Any]:
    """{field: value} of the fields the module's docstring names; ValueError names a bad setting or file. A diffusion LM
    takes none (its requests refuse min_p and repetition_penalty): only 'auto' and 'vllm' there."""
    if isinstance(generation_config, os.PathLike):
        generation_config = os.fspath(generation_config)
    if not isinstance(generation_config, str) or not generation_config:
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got {generation_config!r}")
    if diffusion and generation_config not in ("auto", "vllm"):
        raise ValueError("generation_config applies to autoregressive models; a diffusion LM takes 'auto' or "
                         "'vllm' (no defaults)")
    if generation_config == "vllm" or diffusion:
        return {}
    folder = Path(model_folder if generation_config == "auto" else generation_config)
    if generation_config != "auto" and not folder.is_dir():
        raise ValueError(f"generation_config: {folder} is not a folder ('auto': the model's; 'vllm': none)")
    if generation_config != "auto" and not any((folder / f).is_file() for f in ("generation_config.json", "config.json")):
        raise ValueError(f"generation_config: {folder} holds no generation_config.json (nor config.json)")
    defaults = generation_sampling(folder)
    try:
        SamplingParams(**defaults)
    except ValueError as e:  # every request would be refused for a value no client sent
        raise ValueError(f"{folder}'s generation config: {e} (--generation-config vllm ignores it)") from None
    if defaults:
        log.warning("default sampling parameters from %s: %s (a request's own values win; --generation-config "
                    "vllm: OpenAI's defaults)", folder, defaults)
    return defaults
