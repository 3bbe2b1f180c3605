"""Tier 4 on the real model for tree speculation: SmolLM2-135M greedy output (exact kernels) with every
tree method (and ADED) equals transformers' `generate(do_sample=False)` token for token (3 Spec-Bench prompts,
24 new tokens, one batch)."""

import pytest

from specray import LLM, SamplingParams

from smollm2_helpers import needs_smollm2

pytestmark = needs_smollm2
NUM_PROMPTS, NEW_TOKENS = 3, 24
DRAFT = {"method": "draft_model", "model": "smollm2-135m", "draft_num_layers": 4, "num_speculative_tokens": 3}
CONFIGS = {
    "rsd_c": {**DRAFT, "tree": {"kind": "rsd_c", "branching": [2, 2, 1]}},
    "rsd_s": {**DRAFT, "tree": {"kind": "rsd_s", "width": 2}},
    "spectr": {**DRAFT, "tree": {"kind": "spectr", "k": 2}},
    "topk": {**DRAFT, "tree": {"kind": "topk", "k": 2, "width": 2}, "verify_budget": 6},
    "aded": {"method": "aded", "num_speculative_tokens": 3},
}


@pytest.fixture(scope="module")
def prompt_ids(smollm2_prompt_ids):
    return smollm2_prompt_ids[:NUM_PROMPTS]


@pytest.fixture(scope="module")
def transformers_greedy(smollm2_greedy):
    return [tokens[:NEW_TOKENS] for tokens in smollm2_greedy[:NUM_PROMPTS]]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tree_greedy_equals_transformers(name, prompt_ids, transformers_greedy):
    llm = LLM("smollm2-135m", speculative_config=CONFIGS[name], max_num_seqs=4, kernels="exact")
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sp)
    assert [o.outputs[0].token_ids for o in outs] == transformers_greedy
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
