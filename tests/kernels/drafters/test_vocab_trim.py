"""VocabTrim: the trimmed proposal stays inside its subset, equals the softmax over the subset,
and verification with it stays lossless (DESIGN §8 tiers 1-3, with a negative control)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specray.kernels.drafters.base import DraftRequest
from specray.kernels.drafters.draft_model import DraftModelDrafter
from specray.kernels.drafters.vocab_trim import VocabTrimDrafter, expand_trimmed_logits
from specray.kernels.loader import Checkpoint, load_model
from specray.kernels.sampling import SamplingConfig, processed_probs, sample_rows
from specray.kernels.verify.chain import verify_speculative

SUBSET = torch.tensor([3, 17, 40, 41, 5, 60, 88, 23, 9, 70, 11, 2])  # not sorted on purpose


def test_trimmed_logits_exact():
    trimmed = torch.tensor([[1.0, 2.0, 0.5]])
    ids = torch.tensor([4, 0, 2])
    full = expand_trimmed_logits(trimmed, ids, 6)
    assert full[0, [4, 0, 2]].tolist() == [1.0, 2.0, 0.5]
    assert torch.isinf(full[0, [1, 3, 5]]).all()
    p = processed_probs(full, [SamplingConfig(1.0, top_k=2)])
    want = torch.zeros(6)
    want[[0, 4]] = torch.tensor([2.0, 1.0]).softmax(0)
    torch.testing.assert_close(p[0], want)


@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9)])
def test_trimmed_proposal_stays_in_subset_and_is_the_subset_softmax(tiny_target, sampling):
    full_model = load_model(Checkpoint(tiny_target, "t"))
    trimmed = VocabTrimDrafter(load_model(Checkpoint(tiny_target, "t")), SUBSET, num_blocks=256, block_size=4)
    assert trimmed.model.lm_head.shape == (len(SUBSET), 64)
    reference = DraftModelDrafter(full_model, num_blocks=256, block_size=4)
    gens = [torch.Generator().manual_seed(i) for i in range(48)]
    reqs = [DraftRequest(i, [1, 7 + i % 50, 30], 4, sampling, gens[i]) for i in range(48)]
    props = trimmed.propose(reqs)
    allowed = set(SUBSET.tolist())
    assert all(t in allowed for p in props for t in p.draft_token_ids)
    # the proposal distribution is the processed softmax over the subset of the full head's logits
    ref_reqs = [DraftRequest(i, [1, 7 + i % 50, 30, *props[i].draft_token_ids[:1]], 1, SamplingConfig(0.0))
                for i in range(48)]
    ref_logits = torch.stack([reference._step([reference._calibrate(r)])[0] for r in ref_reqs])  # [48, vocab]
    want = processed_probs(expand_trimmed_logits(ref_logits[:, SUBSET], SUBSET, 97), [sampling] * 48)
    if sampling.greedy:
        assert all(p.draft_probs is None for p in props)
        assert [p.draft_token_ids[1] for p in props] == SUBSET[ref_logits[:, SUBSET].argmax(-1)].tolist()
    else:
        got = torch.stack([p.draft_probs[1] for p in props])  # [48, vocab]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        outside = torch.ones(97, dtype=torch.bool)
        outside[SUBSET] = False
        assert (got[:, outside] == 0).all()


# -- statistical losslessness: tiny vocabulary, a subset that misses some of q's mass -------------
VOCAB, KEEP, N = 8, [0, 2, 3, 6, 7], 100_000


def tables(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(VOCAB, VOCAB, generator=g) * 3).softmax(-1)  # target q(next | prev)
    draft_logits = torch.rand(VOCAB, VOCAB, generator=g) * 3  # the draft's full-vocabulary logits
    keep = torch.tensor(KEEP)
    p_trim = processed_probs(expand_trimmed_logits(draft_logits[:, keep], keep, VOCAB), [SamplingConfig()] * VOCAB)
    return q, p_trim, draft_logits.softmax(-1)


def first_two(q, p_sample, p_report, seed, k=2):
    """One round from a fixed first token: k drafts sampled from p_sample, verified against q with
    p_report as the claimed proposal distribution; the first two emitted tokens (a second round
    for sequences that emitted one)."""
    gen = torch.Generator().manual_seed(seed)

    def round_(prev):
        n = prev.shape[0]
        drafts, reported, rows, cur = [], [], [q[prev]], prev
        for _ in range(k):
            tok = sample_rows(p_sample[cur], gen)
            drafts.append(tok)
            reported.append(p_report[cur])
            rows.append(q[tok])
            cur = tok
        out = verify_speculative(torch.stack(rows, 1).reshape(-1, VOCAB), torch.stack(drafts, 1).reshape(-1),
                                 list(range(0, n * k + 1, k)), torch.stack(reported, 1).reshape(-1, VOCAB), gen)
        return [r.emitted_token_ids for r in out], torch.stack(drafts, 1)

    emitted, drafts = round_(torch.zeros(N, dtype=torch.long))
    short = [i for i, e in enumerate(emitted) if len(e) < 2]
    more, _ = round_(torch.tensor([emitted[i][-1] for i in short]))
    for i, m in zip(short, more):
        emitted[i] = emitted[i] + m
    return np.array([e[:2] for e in emitted]), drafts


def pvalue(tokens, q):
    first = np.bincount(tokens[:, 0], minlength=VOCAB)
    joint = np.bincount(tokens[:, 0] * VOCAB + tokens[:, 1], minlength=VOCAB * VOCAB)
    want_first = q[0].double().numpy()
    want_joint = (q[0].unsqueeze(1) * q).reshape(-1).double().numpy()
    return min(chisquare(first, want_first / want_first.sum() * N).pvalue,
               chisquare(joint, want_joint / want_joint.sum() * N).pvalue)


def test_trimmed_drafts_verify_losslessly():
    q, p_trim, _ = tables()
    tokens, drafts = first_two(q, p_trim, p_trim, seed=1)
    assert set(drafts.unique().tolist()) <= set(KEEP)  # never proposes outside the subset
    assert set(np.unique(tokens).tolist()) - set(KEEP), "the target's mass off the subset must still be emitted"
    assert pvalue(tokens, q) > 1e-3


def test_negative_control_reporting_the_untrimmed_distribution_is_detected():
    """Drafting from the subset but claiming the full softmax as p biases the output."""
    q, p_trim, p_full = tables()
    tokens, _ = first_two(q, p_trim, p_full, seed=2)
    assert pvalue(tokens, q) < 1e-6


@pytest.mark.parametrize("tree", [{"kind": "rsd_c", "branching": [3, 2]}, {"kind": "rsd_s", "width": 3},
                                  {"kind": "spectr", "k": 3}, {"kind": "topk", "k": 3, "width": 3}])
@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(1.0)])
def test_trimmed_trees_stay_in_subset(tiny_target, tree, sampling):
    from specray.kernels.drafters.tree_draft import TreeDraftModelDrafter
    from specray.kernels.drafters.tree_shapes import TreeSpec

    drafter = TreeDraftModelDrafter(load_model(Checkpoint(tiny_target, "t")), TreeSpec.from_dict(tree),
                                    num_blocks=256, block_size=4, vocab_trim_ids=SUBSET)
    gens = [torch.Generator().manual_seed(i) for i in range(16)]
    props = drafter.propose([DraftRequest(i, [1, 7 + i, 30], 2, sampling, gens[i]) for i in range(16)])
    allowed = set(SUBSET.tolist())
    assert all(p.is_tree and p.num_draft_tokens > 1 for p in props)
    assert all(t in allowed for p in props for t in p.draft_token_ids)
    outside = torch.ones(97, dtype=torch.bool)
    outside[SUBSET] = False
    carries_q = not sampling.greedy and tree["kind"] != "topk"  # sampled trees carry each node's q
    for p in props:
        assert (p.draft_probs is not None) == carries_q
        assert p.draft_probs is None or (p.draft_probs[:, outside] == 0).all()
