"""A tiny LongSpec draft for the tests: the target's layers (init_longspec), briefly trained on the
target's own greedy continuations (so that it agrees with the target often, not always), plus
seeded noise."""

import random

import torch

from specray.cluster.distill.data import Sample
from specray.cluster.distill.longspec import save_longspec, train_longspec
from specray.cluster.distill.longspec_train import LongSpecTrainConfig, extract_target_kv, init_longspec
from specray.kernels.loader import _read_safetensors, resolve


def target_samples(target, n=48, seed=0, max_tokens=40) -> list[Sample]:
    from specray import LLM, SamplingParams

    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, 97) for _ in range(rng.randint(3, 30))] for _ in range(n)]
    outs = LLM(str(target)).generate([{"prompt_token_ids": p} for p in prompts],
                                     SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    empty = torch.zeros(max_tokens, 1)
    return [Sample(p, o.outputs[0].token_ids, empty.int(), empty.half()) for p, o in zip(prompts, outs, strict=True)]


def save_tiny_longspec(folder, target, window=8, seed=0, noise=0.05, steps=400):
    from transformers import AutoModelForCausalLM

    ck = resolve(str(target))
    state = _read_safetensors(ck.path)
    layer = init_longspec(state, ck.hf_config(), window)
    cfg = LongSpecTrainConfig(epochs=steps / 24, batch_size=4, lr=3e-3, max_len=128, warmup_steps=5, seed=seed,
                              position_limit=ck.hf_config().max_position_embeddings)
    hf = AutoModelForCausalLM.from_pretrained(ck.path, dtype=torch.float32).eval()
    seqs = extract_target_kv(hf, target_samples(target, n=96, seed=seed), cfg, seed=seed, progress=False)
    embed = state["model.embed_tokens.weight"]
    train_longspec(layer, seqs, embed, state.get("lm_head.weight", embed), cfg, progress=False, log=lambda *_: None)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() == 2:
                p.add_(noise * torch.randn(p.shape, generator=gen) * p.std().clamp_min(0.05))
    return save_longspec(layer, folder, str(target), ck.hf_config().to_dict(), ck.path, dtype=torch.float32)
