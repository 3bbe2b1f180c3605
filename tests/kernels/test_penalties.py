"""The batched penalties against their one-row reference, bit for bit: random histories (repeats,
empty prompts and outputs), rows that do not penalise, odd vocabulary sizes."""

import random

import pytest
import torch

from specray.kernels.penalties import RowHistory, apply_penalties, penalize_row
from specray.kernels.sampling import SamplingConfig


def _case(rng: random.Random, rows: int, vocab: int):
    configs, histories = [], []
    for _ in range(rows):
        cfg = SamplingConfig(1.0, repetition_penalty=rng.choice([1.0, 0.7, 1.3, 2.0]),
                             frequency_penalty=rng.choice([0.0, 0.5, -1.1]), presence_penalty=rng.choice([0.0, 0.3, -2.0]))
        penalised = cfg.penalized and rng.random() > 0.2
        configs.append(cfg if penalised else SamplingConfig(0.0))
        history = RowHistory(tuple(rng.randrange(vocab) for _ in range(rng.randint(0, 6))),
                             tuple(rng.randrange(vocab) for _ in range(rng.randint(0, 9))))
        histories.append(history if penalised or rng.random() < 0.5 else None)
    return configs, histories


@pytest.mark.parametrize("seed", range(40))
def test_batched_penalties_equal_the_row_reference(seed):
    rng = random.Random(seed)
    rows, vocab = rng.randint(1, 7), rng.choice([3, 17, 50, 129])
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3  # [rows, vocab]
    configs, histories = _case(rng, rows, vocab)
    got = apply_penalties(logits, configs, histories)
    want = torch.stack([penalize_row(logits[i], c, histories[i]) if c.penalized else logits[i]
                        for i, c in enumerate(configs)])
    assert torch.equal(got, want)
    assert apply_penalties(logits, [SamplingConfig(1.0)] * rows, [None] * rows) is logits  # no copy
