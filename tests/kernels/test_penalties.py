"""The batched penalties against their one-row reference, bit for bit: random histories (repeats,
empty prompts and outputs), rows that do not penalise, odd vocabulary sizes; and a sequence's
incremental history (SeqHistory, a worker's across steps) against the rows built from scratch."""

import random

import pytest
import torch

from specray.kernels.penalties import (RowHistory, SeqHistory, apply_bad_words, apply_min_tokens, apply_penalties,
                                       penalize_row, row_histories)
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


def _answers(h) -> tuple:
    ids, counts = h.output_counts()
    order = ids.argsort()
    return (h.output_len, [h.output_tail(n) for n in range(6)], ids[order].tolist(), counts[order].tolist(),
            sorted(h.prompt_ids().tolist()))


@pytest.mark.parametrize("seed", range(12))
def test_a_sequences_incremental_history_answers_as_its_rows_built_from_scratch(seed):
    """Prefill in chunks, then rounds of chains and trees, the tokens committed in place as a worker
    commits them: every step's rows give the same answers and the same processed logits."""
    rng, vocab = random.Random(seed), 23
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
    tokens: list[int] = []
    history = SeqHistory(len(prompt), tokens)
    cfg = SamplingConfig(1.0, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=-0.3, min_tokens=4,
                         stop_ids=(3,), bad_words_ids=((5,), (6, 7), (1, 2, 4)))
    chunks = [prompt[i:i + 5] for i in range(0, len(prompt), 5)]
    for step in range(14):
        new = chunks[step] if step < len(chunks) else [rng.randrange(8)]  # small ids: repeats and bad words
        k = rng.randint(0, 3) if step >= len(chunks) - 1 else 0
        chain = list(range(-1, k - 1))
        parents = chain if rng.random() < 0.5 else [rng.randrange(-1, i) for i in range(k)]
        drafts = [rng.randrange(8) for _ in range(k)]
        got = history.rows(new, parents, drafts)
        want = row_histories(len(prompt), tokens + new, parents, drafts)
        assert [_answers(h) for h in got] == [_answers(h) for h in want], step
        logits = torch.randn(len(want), vocab, generator=torch.Generator().manual_seed(step))
        configs = [cfg] * len(want)
        for apply in (apply_penalties, apply_bad_words, apply_min_tokens):
            assert torch.equal(apply(logits, configs, got), apply(logits, configs, want)), apply.__name__
        tokens += new + drafts[:rng.randint(0, k)] if parents == chain else new  # in place, as the worker does
