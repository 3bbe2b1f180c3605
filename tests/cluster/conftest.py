"""The SmolLM2-135M tier-4 reference, shared by test_smollm2*.py (one xdist group, so it is built once):
transformers' greedy `generate` on the first Spec-Bench prompts of the packaged subset."""

import json

import pytest
import torch

from specray.kernels.chat import prompt_token_ids

from smollm2_helpers import DATA, REFERENCE_PROMPTS, REFERENCE_TOKENS


@pytest.fixture(scope="session")
def smollm2_prompt_ids() -> list[list[int]]:
    from specray.kernels.loader import resolve

    tok = resolve("smollm2-135m").tokenizer()
    questions = [json.loads(line)["turns"][0] for line in DATA.read_text().splitlines()][:REFERENCE_PROMPTS]
    return [prompt_token_ids(tok, q)
            for q in questions]


@pytest.fixture(scope="session")
def smollm2_hf():
    from transformers import AutoModelForCausalLM

    from specray.kernels.loader import resolve

    return AutoModelForCausalLM.from_pretrained(resolve("smollm2-135m").path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_greedy(smollm2_prompt_ids, smollm2_hf) -> list[list[int]]:
    """[prompt][token] transformers' greedy tokens, REFERENCE_TOKENS each (a shorter run is a prefix)."""
    from specray.cluster.bench.hf_baselines import hf_greedy

    return [hf_greedy(smollm2_hf, ids, REFERENCE_TOKENS) for ids in smollm2_prompt_ids]
