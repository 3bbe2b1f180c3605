"""Admission under a prompt-token budget (`max_prefill_tokens`): a round admits prompts up to the
budget, one always; the outputs are those of admitting everything at once, token for token (a
row's numbers do not depend on its step), with and without speculation."""

import pytest

from specray import LLM

from router_helpers import GREEDY, prompts


def admitted_per_round(llm, n: int) -> list[int]:
    """How many prompts each round admits when `n` wait at once (the prompts of `prompts(n)`)."""
    router = llm.router
    for p in prompts(n):
        router.add_request(p["prompt_token_ids"], GREEDY)
    counts = []
    while router.waiting:
        before = len(router.waiting)
        router.step()
        counts.append(before - len(router.waiting))
    return counts


def test_a_round_admits_prompts_up_to_the_budget_and_one_always(tiny_target):
    lengths = [len(p["prompt_token_ids"]) for p in prompts(6)]
    budget = lengths[0] + lengths[1]
    counts = admitted_per_round(LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=budget), 6)
    assert counts[0] == 2 and sum(counts) == 6
    assert admitted_per_round(LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=1), 6) == [1] * 6
    assert admitted_per_round(LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=None), 6) == [6]


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3}])
def test_the_budget_does_not_change_outputs(tiny_target, spec):
    outs = []
    for budget in (None, 1, 40):
        llm = LLM(str(tiny_target), kv_cache_tokens=8192, max_prefill_tokens=budget, speculative_config=spec)
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts(8), GREEDY)])
    assert outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("bad", [0, -5, 2.5, "512"])
def test_a_bad_budget_is_a_clear_error(tiny_target, bad):
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        LLM(str(tiny_target), max_prefill_tokens=bad)
