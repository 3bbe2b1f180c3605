"""transformers baselines for the benchmarks and the SmolLM2 tests: plain, prompt lookup and
assisted generation with the same (truncated) draft specray uses."""

from __future__ import annotations

from pathlib import Path

import torch


def load_hf(path: Path):
    from transformers import AutoModelForCausalLM

    from specray.kernels.loader import hf_config

    return AutoModelForCausalLM.from_pretrained(path, config=hf_config(path), dtype=torch.float32).eval()


def truncated_assistant(target, num_layers: int | None):
    """The target's first `num_layers` layers as a transformers model (specray's `draft_num_layers`)."""
    import copy

    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers or config.num_hidden_layers
    draft = LlamaForCausalLM(config)
    draft.load_state_dict(target.state_dict(), strict=False)  # layers past num_layers are dropped
    draft.tie_weights()
    return draft.eval()


def hf_generate(model, batch: list[list[int]], max_tokens: int, temperature: float = 0.0,
                seed: int = 0, **kw) -> list[list[int]]:
    """`generate` for exactly `max_tokens` tokens per prompt (left-padded batch), EOS ignored like
    specray's `ignore_eos`: min_new_tokens would mask EOS out and change the argmax, while an
    impossible eos_token_id never stops (its warning is silenced)."""
    from transformers.utils import logging as hf_logging

    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    width = max(len(ids) for ids in batch)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
        dict(do_sample=False)
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=mask, max_new_tokens=max_tokens, eos_token_id=-1,
                                 pad_token_id=pad, **sampling, **kw)
    finally:
        hf_logging.set_verbosity(verbosity)
    return [row[width:].tolist() for row in out]


def hf_greedy(model, ids: list[int], max_tokens: int, **kw) -> list[int]:
    return hf_generate(model, [ids], max_tokens, **kw)[0]
