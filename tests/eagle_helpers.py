"""A tiny feature-level draft for the tests (tests/kernels/test_eagle.py, the engine sampling tests)."""

import torch

from specray.cluster.distill.eagle_model import init_eagle, save_eagle
from specray.kernels.loader import _read_safetensors, resolve


def save_tiny_eagle(folder, target, seed=0, noise=0.3, vocab_trim=None):
    """init_eagle from the target, then seeded noise on fc and the layer (an imperfect draft)."""
    ck = resolve(str(target))
    draft = init_eagle(_read_safetensors(ck.path), ck.hf_config(), feature_rms=1.0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.requires_grad and p.dim() == 2:
                p.add_(noise * torch.randn(p.shape, generator=gen) * p.std().clamp_min(0.05))
    table = None if vocab_trim is None else {"token_ids": vocab_trim}
    return save_eagle(draft, folder, str(target), ck.path, vocab_trim=table,
                      info={"vocab_trim_k": 0 if vocab_trim is None else int(vocab_trim.numel())})
