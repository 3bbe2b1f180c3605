"""Chain verification rules: exact tiny cases, seeded determinism, statistical losslessness with a
negative control (DESIGN §8 tiers 1-3)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specray.kernels.sampling import SamplingConfig, processed_probs, sample_rows
from specray.kernels.verify import chain as verify
from specray.kernels.verify.chain import verify_greedy, verify_speculative


def onehot_logits(rows, vocab=6):
    out = torch.full((len(rows), vocab), -5.0)
    for i, t in enumerate(rows):
        out[i, t] = 5.0
    return out


# -- tier 1: exact tiny cases ---------------------------------------------------------------------
def test_greedy_ragged_batch_exact():
    # seq 0: drafts [1, 2, 3], target argmax [1, 2, 4, 5] -> accept 2, recovered 4
    # seq 1: drafts [], target argmax [3] -> bonus 3 (non-speculative step)
    # seq 2: drafts [0, 0], target argmax [0, 0, 2] -> accept all, bonus 2
    # seq 3: drafts [5], target argmax [1, 0] -> reject at once, recovered 1
    logits = onehot_logits([1, 2, 4, 5, 3, 0, 0, 2, 1, 0])
    res = verify_greedy(logits, torch.tensor([1, 2, 3, 0, 0, 5]), [0, 3, 3, 5, 6])
    assert [r.accepted_token_ids for r in res] == [[1, 2], [], [0, 0], []]
    assert [r.next_token_id for r in res] == [4, 3, 2, 1]
    assert [r.is_bonus for r in res] == [False, True, True, False]
    assert [r.emitted_token_ids for r in res] == [[1, 2, 4], [3], [0, 0, 2], [1]]


def test_speculative_certain_accept_and_certain_reject():
    vocab = 4
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.0, 0.0]])
    p = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    # token 1 has q = p = 1 -> accepted; token 2 has q = 0 -> rejected, residual is all on token 3
    res = verify_speculative(q, torch.tensor([1, 2]), [0, 2], p, torch.Generator().manual_seed(0))[0]
    assert res.accepted_token_ids == [1] and res.next_token_id == 3 and not res.is_bonus
    # deterministic proposal: q(x)=1 always accepted; the bonus comes from the last row
    q2 = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    res = verify_speculative(q2, torch.tensor([1]), [0, 1], None, torch.Generator().manual_seed(0))[0]
    assert res.emitted_token_ids == [1, 2] and res.is_bonus
    assert vocab == q.shape[1]


def test_residual_distribution_exact():
    q = torch.tensor([[0.5, 0.3, 0.2]])
    p = torch.tensor([[0.2, 0.6, 0.2]])
    torch.testing.assert_close(verify.residual_distribution(q, p), torch.tensor([[1.0, 0.0, 0.0]]))


def test_processing_greedy_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    cfgs = [SamplingConfig(0.0), SamplingConfig(1.0, top_k=2), SamplingConfig(1.0, top_p=0.8),
            SamplingConfig(1.0)]
    probs = processed_probs(logits, cfgs)
    torch.testing.assert_close(probs[0], torch.tensor([1.0, 0, 0, 0]))
    torch.testing.assert_close(probs[1], torch.tensor([0.625, 0.375, 0, 0]))
    torch.testing.assert_close(probs[2], torch.tensor([0.625, 0.375, 0, 0]))  # 0.5 + 0.3 reaches 0.8
    torch.testing.assert_close(probs[3], torch.tensor([0.5, 0.3, 0.15, 0.05]))


# -- tier 2: determinism ------------------------------------------------------------------------
def test_per_sequence_seeds_are_reproducible_and_batch_independent():
    torch.manual_seed(0)
    q = torch.rand(8, 10).softmax(-1)
    p = torch.rand(6, 10).softmax(-1)
    x = torch.randint(0, 10, (6,))
    gens = lambda: [torch.Generator().manual_seed(s) for s in (11, 12)]  # noqa: E731
    a = verify_speculative(q, x, [0, 3, 6], p, gens())
    b = verify_speculative(q, x, [0, 3, 6], p, gens())
    assert [r.emitted_token_ids for r in a] == [r.emitted_token_ids for r in b]
    # sequence 1 alone, same seed -> same outcome as inside the batch
    alone = verify_speculative(q[4:], x[3:], [0, 3], p[3:], [torch.Generator().manual_seed(12)])
    assert alone[0].emitted_token_ids == a[1].emitted_token_ids


# -- tier 3: statistical losslessness -----------------------------------------------------------
VOCAB, N = 5, 100_000


def markov_tables(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(VOCAB, VOCAB, generator=g) * 3).softmax(-1)  # target q(next | prev)
    p = (torch.rand(VOCAB, VOCAB, generator=g) * 3).softmax(-1)  # draft p(next | prev)
    return q, p


def one_round(q, p, prev, k, gen, deterministic=False):
    """Draft k tokens from p (or its argmax chain), verify against q; returns emitted lists."""
    n = prev.shape[0]
    drafts, draft_probs, rows, cur = [], [], [q[prev]], prev
    for _ in range(k):
        probs = p[cur]  # [n, vocab]
        tok = probs.argmax(-1) if deterministic else sample_rows(probs, gen)
        drafts.append(tok)
        draft_probs.append(probs)
        rows.append(q[tok])
        cur = tok
    draft_ids = torch.stack(drafts, 1).reshape(-1)  # [n * k] sequence-major
    target = torch.stack(rows, 1).reshape(n * (k + 1), VOCAB)
    dp = None if deterministic else torch.stack(draft_probs, 1).reshape(n * k, VOCAB)
    cu = list(range(0, n * k + 1, k))
    return [r.emitted_token_ids for r in verify_speculative(target, draft_ids, cu, dp, gen)]


def first_two_tokens(q, p, k, seed, deterministic=False):
    gen = torch.Generator().manual_seed(seed)
    start = torch.zeros(N, dtype=torch.long)
    emitted = one_round(q, p, start, k, gen, deterministic)
    short = [i for i, e in enumerate(emitted) if len(e) < 2]
    if short:
        prev = torch.tensor([emitted[i][-1] for i in short])
        for i, more in zip(short, one_round(q, p, prev, k, gen, deterministic)):
            emitted[i] = emitted[i] + more
    return np.array([e[:2] for e in emitted])


def chi2_pvalue(tokens, q):
    first = np.bincount(tokens[:, 0], minlength=VOCAB)
    joint = np.bincount(tokens[:, 0] * VOCAB + tokens[:, 1], minlength=VOCAB * VOCAB)
    want_first = q[0].double().numpy()
    want_joint = (q[0].unsqueeze(1) * q).reshape(-1).double().numpy()
    p_first = chisquare(first, want_first / want_first.sum() * N).pvalue
    p_joint = chisquare(joint, want_joint / want_joint.sum() * N).pvalue
    return min(p_first, p_joint)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("deterministic", [False, True])
def test_speculative_sampling_is_lossless(k, deterministic):
    q, p = markov_tables()
    assert chi2_pvalue(first_two_tokens(q, p, k, seed=k, deterministic=deterministic), q) > 1e-3


def test_negative_control_skipping_the_residual_is_detected(monkeypatch):
    q, p = markov_tables()
    monkeypatch.setattr(verify, "residual_distribution", lambda q_rows, p_rows: q_rows)
    assert chi2_pvalue(first_two_tokens(q, p, 2, seed=5), q) < 1e-6


def test_negative_control_wrong_acceptance_is_detected(monkeypatch):
    """Accepting every draft token (no ratio test) must be caught too."""
    q, p = markov_tables()
    monkeypatch.setattr(verify, "first_rejection",
                        lambda accept, cu: [cu[b + 1] - cu[b] for b in range(len(cu) - 1)])
    assert chi2_pvalue(first_two_tokens(q, p, 2, seed=6), q) < 1e-6
