"""LongSpec through the engine: greedy output equals plain greedy decoding token for token (chains
and trees, batch 1-8, prompts longer than the draft's window), sampled rounds keep the target's
joint law of their first two tokens (chi-square, with a failing negative control), and bad
configurations are clear errors."""

import numpy as np
import pytest

from specray import LLM, SamplingParams
from specray.kernels.verify import chain as verify_chain
from specray.kernels.verify import tree as verify_tree

from enumeration import longest_match_over_independent_samples
from longspec_helpers import save_tiny_longspec
from router_helpers import chi2_joint as chi2
from router_helpers import exact_joint_of_tokens_2_and_3

WINDOW = 6  # tiny_longspec's (tests/conftest.py): most prompts are longer
PROMPTS = [[1, 17, 40, 23], [1, 5, 9, 8, 7, 6, 5, 4, 3, 2, 44, 45, 46],
           [1, 88, 3, 3, 3, 70, 12, 44, 9, 3, 3, 70, 12, 44], [1, 30], *[[1, 7 + i, 20, 3 * i + 4] * 3 for i in range(4)]]


def greedy_outputs(llm, prompts, max_tokens=24):
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], sp)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("spec", [{"num_speculative_tokens": 1}, {"num_speculative_tokens": 4},
                                  {"num_speculative_tokens": 3, "tree": {"kind": "rsd_c", "branching": [2, 2, 1]}},
                                  {"num_speculative_tokens": 3, "tree": {"kind": "topk", "k": 2, "width": 3}},
                                  {"num_speculative_tokens": 3, "lookup_first": True}])
def test_greedy_equals_plain_decoding(tiny_target, tiny_longspec, batch, spec, caplog):
    prompts = PROMPTS[:batch]
    assert batch == 1 or max(len(p) for p in prompts) > WINDOW
    want = [o.outputs[0].token_ids for o in greedy_outputs(LLM(str(tiny_target)), prompts)]
    llm = LLM(str(tiny_target), speculative_config={"method": "longspec", "model": str(tiny_longspec), **spec})
    outs = greedy_outputs(llm, prompts)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
    assert llm.draft.drafter.name.startswith("longspec")
    assert "draft pool failed" not in caplog.text


def test_pipelined_and_seeded_sampling_reproduce(tiny_target, tiny_longspec):
    spec = {"method": "longspec", "model": str(tiny_longspec), "num_speculative_tokens": 3}
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:4]]
    sp = SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=11)
    a = LLM(str(tiny_target), speculative_config=spec).generate(prompts, sp)
    b = LLM(str(tiny_target), speculative_config=spec, pipelined=True).generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    want = [o.outputs[0].token_ids for o in greedy_outputs(LLM(str(tiny_target)), PROMPTS[:4])]
    got = greedy_outputs(LLM(str(tiny_target), speculative_config=spec, pipelined=True), PROMPTS[:4])
    assert [o.outputs[0].token_ids for o in got] == want


# -- temperature 1: the joint law of a round's first two tokens -------------------------------------
N = 4000
VOCAB = 97
JOINT_PROMPT = {"prompt_token_ids": [1, 17, 40, 23]}


@pytest.fixture(scope="module")
def peaky_longspec(peaky_models, tmp_path_factory):
    return save_tiny_longspec(tmp_path_factory.mktemp("peaky_longspec") / "draft", peaky_models[0], window=3,
                              seed=2, noise=0.25)


@pytest.fixture(scope="module")
def want(peaky_models):
    return exact_joint_of_tokens_2_and_3(peaky_models[0], JOINT_PROMPT)


def tokens_2_and_3(target, draft, tree, seed, n=N):
    cfg = {"method": "longspec", "model": str(draft), "num_speculative_tokens": 2, **({"tree": tree} if tree else {})}
    llm = LLM(str(target), speculative_config=cfg, kv_cache_tokens=1 << 14, max_num_seqs=128, seed=seed)
    outs = llm.generate([JOINT_PROMPT] * n, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True))
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0.1 * n < accepted < 0.95 * drafted, "the test needs frequent acceptance and rejection"
    tokens = np.array([o.outputs[0].token_ids[1:3] for o in outs])  # [n, 2]
    return tokens[:, 0] * VOCAB + tokens[:, 1]


@pytest.mark.parametrize("tree", [None, {"kind": "rsd_s", "width": 3}, {"kind": "spectr", "k": 3}])
def test_sampling_keeps_the_targets_joint_law(peaky_models, peaky_longspec, want, tree):
    assert chi2(tokens_2_and_3(peaky_models[0], peaky_longspec, tree, seed=1), want) > 1e-3


def test_negative_controls_are_detected(peaky_models, peaky_longspec, want, monkeypatch):
    """All and a third of the lossless tests' samples: p 9e-30 and 3e-15 (at half the samples the
    first read 1.2e-6 against the bar of 1e-6 once the draws became float64: too near to trust)."""
    monkeypatch.setattr(verify_chain, "residual_distribution", lambda q, p: q)
    assert chi2(tokens_2_and_3(peaky_models[0], peaky_longspec, None, seed=2, n=N), want) < 1e-6
    monkeypatch.undo()
    exact = verify_tree.verify_tree
    monkeypatch.setattr(verify_tree, "verify_tree", lambda rule, rows, proposal, draws: (
        longest_match_over_independent_samples(rows, proposal, draws) if rule == "descent"
        else exact(rule, rows, proposal, draws)))
    assert chi2(tokens_2_and_3(peaky_models[0], peaky_longspec, {"kind": "topk", "k": 3, "width": 3}, seed=3,
                               n=N // 3), want) < 1e-6


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,match", [({"longspec": {"window": 0}}, "window must be an integer >= 1"),
                                         ({"longspec": {"window": 10_000}}, "window 10000 exceeds"),
                                         ({"longspec": {"size": 3}}, "unknown longspec options"),
                                         ({"model": None}, "needs a draft 'model'")])
def test_bad_longspec_configs_are_clear_errors(tiny_target, tiny_longspec, extra, match):
    cfg = {"method": "longspec", "model": str(tiny_longspec), **extra}
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny_target), speculative_config=cfg)


def test_longspec_options_need_the_method(tiny_target, tiny_draft):
    with pytest.raises(ValueError, match="'longspec' options need method"):
        LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "longspec": {"window": 4}})


def test_a_draft_of_other_shapes_or_kind_is_refused(tiny_target, tiny_longspec, tiny_draft, tmp_path):
    from helpers import save_tiny_llama

    other = save_tiny_llama(tmp_path / "other", seed=3, num_key_value_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads 2 != 4"):
        LLM(str(other), speculative_config={"method": "longspec", "model": str(tiny_longspec)})
    with pytest.raises(ValueError, match="not a LongSpec draft"):
        LLM(str(tiny_target), speculative_config={"method": "longspec", "model": str(tiny_draft)})


def test_a_context_past_the_targets_limit_is_refused(tiny_target, tiny_longspec):
    llm = LLM(str(tiny_target), speculative_config={"method": "longspec", "model": str(tiny_longspec)})
    with pytest.raises(ValueError, match="context is 512 tokens"):
        llm.generate({"prompt_token_ids": [5] * 600}, SamplingParams(max_tokens=4))
