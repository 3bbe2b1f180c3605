"""Adaptive speculation length (cluster/router/adaptive.py): exact acceptance bookkeeping, the
choice against a brute-force optimum, probing, timing estimates; and through the engine, greedy
token-for-token equality with plain decoding, seeded requests untouched by timings, and a
chi-square on sampled tokens with a negative control."""

import itertools

import numpy as np
import pytest
import torch

from specray import LLM, SamplingParams
from specray.cluster.router import adaptive
from specray.cluster.router.adaptive import Acceptance, LengthPolicy, expected_gains
from specray.kernels.row_costs import RowCosts
from specray.kernels.verify import chain as verify

from router_helpers import GREEDY, chi2, exact_second_token_distribution, prompts

FLAT = RowCosts((1.0,) * 8)  # verified rows free: every draft token pays
STEEP = RowCosts(tuple(float(r) for r in range(1, 9)))  # a row costs a whole step: none pays


def test_acceptance_counts_each_position_reached_and_accepted():
    acc = Acceptance()
    acc.record(3, 1, decay=1.0)  # position 0 accepted, position 1 rejected, position 2 never reached
    assert acc.reached == [1.0, 1.0, 0.0] and acc.accepted == [1.0, 0.0, 0.0]
    acc.record(2, 2, decay=0.5)  # both accepted: reached 0 and 1 (2 was not drafted)
    assert acc.reached == [1.5, 1.5, 0.0] and acc.accepted == [1.5, 1.0, 0.0]
    assert acc.rate(1, prior=0.5, weight=2.0) == pytest.approx((1.0 + 1.0) / (1.5 + 2.0))
    assert acc.rate(5, prior=0.3) == pytest.approx(0.3), "an unseen position takes the prior"
    with pytest.raises(AssertionError):
        acc.record(1, 2)


def test_expected_gains_multiply_the_rates():
    acc, pooled = Acceptance(), Acceptance()
    for _ in range(200):
        acc.record(2, 1, decay=1.0)  # position 0 always accepted, position 1 never
    a0, a1 = acc.rate(0, 0.5), acc.rate(1, 0.5)
    assert expected_gains(acc, pooled, 2) == pytest.approx([1.0, 1.0 + a0, 1.0 + a0 + a0 * a1])
    assert a0 > 0.99 and a1 < 0.01


def _brute_force(policy, seqs, base_rows):
    """The best value over every combination of lengths."""
    return max(policy.value(seqs, list(ks), base_rows) for ks in itertools.product(*[range(c + 1) for _, c in seqs]))


@pytest.mark.parametrize("seed", range(40))
def test_a_lone_sequence_gets_the_best_length(seed):
    rng = np.random.default_rng(seed)
    costs = RowCosts.monotone(list(np.cumsum(rng.uniform(0.02, 0.8, 8))))
    policy = LengthPolicy(costs, model_tokens=None if seed % 2 else 1)
    policy.draft_steps_seen.append(float(rng.uniform(0, 0.3)) * costs.seconds[0])
    policy._fit = (float(rng.uniform(0, 0.5)) * costs.seconds[0], float(rng.uniform(0, 0.1)) * costs.seconds[0])
    acc = Acceptance()
    for _ in range(int(rng.integers(0, 6))):
        n = int(rng.integers(1, 5))
        acc.record(n, int(rng.integers(0, n + 1)))
    seqs = [(acc, int(rng.integers(1, 6)))]
    assert policy.value(seqs, policy.lengths(seqs, 1), 1) == pytest.approx(_brute_force(policy, seqs, 1))


@pytest.mark.parametrize("seed", range(20))
def test_a_batch_does_no_worse_than_none_or_all(seed):
    rng = np.random.default_rng(100 + seed)
    policy = LengthPolicy(RowCosts.monotone(list(np.cumsum(rng.uniform(0.05, 0.6, 16)))))
    policy.draft_steps_seen.append(float(rng.uniform(0, 0.2)) * policy.costs.seconds[0])
    seqs = []
    for _ in range(3):
        acc = Acceptance()
        for _ in range(4):
            acc.record(3, int(rng.integers(0, 4)))
        seqs.append((acc, 3))
    chosen = policy.value(seqs, policy.lengths(seqs, 3), 3)
    assert chosen >= policy.value(seqs, [0, 0, 0], 3) and chosen >= policy.value(seqs, [3, 3, 3], 3)
    assert chosen >= 0.97 * _brute_force(policy, seqs, 3)


def test_cheap_rows_draft_the_cap_and_dear_ones_nothing_but_probes():
    acc = Acceptance()
    assert LengthPolicy(FLAT).lengths([(acc, 4)], 1) == [4]
    dear, every = LengthPolicy(STEEP), adaptive.PROBE_EVERY
    lengths = [dear.lengths([(acc, 4)], 1)[0] for _ in range(7 * every)]
    probes = [i for i, k in enumerate(lengths) if k]
    assert probes == [every - 1, 3 * every - 1, 7 * every - 1], "the wait doubles while probes show no gain"
    assert {lengths[i] for i in probes} == {1}
    assert dear.lengths([(acc, 0)], 1) == [0], "a zero cap is never probed"
    assert LengthPolicy(FLAT).lengths([(acc, 4)], 1) == [4] and acc.probe_after == every, "drafting resets it"


def test_timings_give_the_draft_step_and_what_a_round_costs_besides():
    policy = LengthPolicy(RowCosts((0.010, 0.012, 0.014, 0.016)), model_tokens=1)
    for _ in range(5):  # beyond the forward: 2 ms a round, 0.5 ms a draft token; a draft step 1 ms
        policy.observe(rows=1, round_seconds=0.012, draft_seconds=0.0, lengths=[0])
        policy.observe(rows=3, round_seconds=0.014 + 0.001 + 0.003, draft_seconds=0.001, lengths=[2])
        policy.observe(rows=4, round_seconds=0.016 + 0.001 + 0.0035, draft_seconds=0.001, lengths=[3])
    policy.observe(rows=1, round_seconds=0.5, draft_seconds=0.0, lengths=[0])  # a stall moves no median
    assert policy._fit == pytest.approx((0.002, 0.0005))
    assert policy.draft_step_seconds == pytest.approx(0.001)
    assert policy._round_cost(1, 2, 2) == pytest.approx(0.002 + 0.001 + 0.014 + 0.001)
    before = policy._fit
    policy.observe(rows=2, round_seconds=0.5, draft_seconds=None, lengths=[1])  # a catch-up round
    assert policy._fit == before and len(policy.draft_steps_seen) == 10


# -- through the engine ------------------------------------------------------------------------
def _adaptive_llm(target, draft, **spec):
    return LLM(str(target), kv_cache_tokens=8192, speculative_config={
        "method": "draft_model", "model": str(draft), "num_speculative_tokens": 4, "adaptive": True, **spec})


@pytest.mark.parametrize("costs", [FLAT, STEEP])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_adaptive_equals_non_speculative(tiny_target, tiny_draft, costs, batch, monkeypatch):
    want = [o.outputs[0].token_ids for o in LLM(str(tiny_target), kv_cache_tokens=8192).generate(prompts(batch), GREEDY)]
    llm = _adaptive_llm(tiny_target, tiny_draft, lookup_first={"min_match": 1, "model_tokens": 2})
    llm.router.lengths.costs = costs
    chosen = []
    original = LengthPolicy.lengths
    monkeypatch.setattr(LengthPolicy, "lengths", lambda self, *a: chosen.append(original(self, *a)) or chosen[-1])
    outs = llm.generate(prompts(batch), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == want
    flat = [k for ks in chosen for k in ks]
    assert (max(flat) == 4) if costs is FLAT else (set(flat) == {0, 1}), "the costs must steer the lengths"


def test_seeded_requests_keep_their_length_whatever_the_timings(tiny_target, tiny_draft):
    llm = _adaptive_llm(tiny_target, tiny_draft)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=3, ignore_eos=True)
    runs = []
    for costs in (FLAT, STEEP):
        llm.router.lengths.costs = costs
        out = llm.generate(prompts(2), [seeded, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)])
        m = out[0].metrics
        assert m.num_draft_tokens >= 4 * (m.num_rounds - 1), "the seeded request drafts its full length"
        runs.append(out[0].outputs[0].token_ids)
    assert runs[0] == runs[1]


def test_no_policy_without_the_flag_or_a_draft(tiny_target, tiny_draft):
    assert LLM(str(tiny_target), speculative_config={"model": str(tiny_draft)}).router.lengths is None
    assert LLM(str(tiny_target)).router.lengths is None


@pytest.mark.parametrize("cfg,match", [
    ({"method": "ngram", "adaptive": "yes"}, "adaptive must be true or false"),
    ({"model": "x", "adaptive": True, "tree": {"kind": "rsd_c", "branching": [2, 2]}}, "apply to chains"),
    ({"method": "aded", "adaptive": True}, "apply to chains"),
])
def test_bad_adaptive_configs_are_refused(cfg, match):
    from specray.cluster.config.speculative import SpeculativeConfig

    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.from_dict(cfg)


# -- sampled: the chain rule under lengths that change round to round --------------------------
PROMPT = {"prompt_token_ids": [1, *range(3, 60, 2)]}
N = 6_000


class RandomLengths(LengthPolicy):
    """Any length from 0 to the cap, drawn independently of the round's tokens (as the policy's
    come from earlier rounds): the chain rule must stay exact whatever each round drafts."""

    def __init__(self, policy: LengthPolicy):
        super().__init__(policy.costs, policy.model_tokens)
        self.rng = np.random.default_rng(7)

    def lengths(self, seqs, base_rows):
        return [int(self.rng.integers(0, cap + 1)) for _, cap in seqs]


@pytest.fixture(scope="module")
def adaptive_llm(peaky_models):
    target, draft = peaky_models
    llm = LLM(str(target), kv_cache_tokens=65536, max_num_seqs=512, speculative_config={
        "model": str(draft), "num_speculative_tokens": 3, "adaptive": True})
    llm.router.lengths = RandomLengths(llm.router.lengths)
    return llm


def second_tokens(llm, n):
    outs = llm.generate([PROMPT] * n, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
    assert len({o.metrics.num_draft_tokens for o in outs}) > 3, "lengths must vary between requests"
    return np.array([o.outputs[0].token_ids[1] for o in outs])


def test_adaptive_sampling_is_lossless(adaptive_llm):
    torch.manual_seed(0)
    want = exact_second_token_distribution(adaptive_llm, PROMPT["prompt_token_ids"])
    assert chi2(second_tokens(adaptive_llm, N), want) > 1e-3


def test_adaptive_negative_control_detected(adaptive_llm, monkeypatch):
    torch.manual_seed(1)
    want = exact_second_token_distribution(adaptive_llm, PROMPT["prompt_token_ids"])
    monkeypatch.setattr(verify, "residual_distribution", lambda q, p: q)
    assert chi2(second_tokens(adaptive_llm, N), want) < 1e-6
