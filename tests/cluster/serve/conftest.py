"""The engine the hostile-client modules share (one per module: tests/hostile_helpers.py)."""

import pytest

from specray import LLM, SamplingParams

from hostile_helpers import GOOD, Engine


@pytest.fixture(scope="module")
def engine(tiny_target):
    with Engine(tiny_target) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_target):
    llm = LLM(str(tiny_target))
    return llm.generate({"prompt_token_ids": GOOD}, SamplingParams(temperature=0, max_tokens=150, ignore_eos=True))[0]
