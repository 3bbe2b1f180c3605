"""Tier 4 on tiny fp32 models: greedy speculative output equals greedy non-speculative output,
token for token, at batch sizes 1, 3 and 16, with ragged acceptance and continuous batching."""

import pytest

from specray import LLM, SamplingParams

from router_helpers import GREEDY, prompts


@pytest.fixture(scope="module")
def reference(tiny_target):
    llm = LLM(str(tiny_target), kv_cache_tokens=8192)
    return {n: [o.outputs[0].token_ids for o in llm.generate(prompts(n), GREEDY)] for n in (1, 3, 16)}


@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_speculative_equals_non_speculative(tiny_target, tiny_draft, reference, batch, method):
    cfg = {"method": method, "num_speculative_tokens": 3}
    if method == "draft_model":
        cfg["model"] = str(tiny_draft)
    llm = LLM(str(tiny_target), speculative_config=cfg, kv_cache_tokens=8192)
    outs = llm.generate(prompts(batch), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference[batch]
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert drafted > 0 and 0 < accepted < drafted, "acceptance must be partial (ragged) to exercise rejection"
    assert len({o.metrics.num_accepted_tokens for o in outs}) > 1 or batch == 1


def test_continuous_batching_joins_and_leaves(tiny_target, tiny_draft, reference):
    """max_num_seqs below the batch: requests join as others finish; varied max_tokens."""
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 4},
              max_num_seqs=5, kv_cache_tokens=8192)
    params = [SamplingParams(temperature=0.0, max_tokens=4 + (i * 5) % 21, ignore_eos=True) for i in range(16)]
    outs = llm.generate(prompts(16), params)
    for o, p, ref in zip(outs, params, reference[16]):
        assert o.outputs[0].token_ids == ref[: p.max_tokens]
        assert o.outputs[0].finish_reason == "length"


def test_per_request_speculation_override(tiny_target, tiny_draft, reference):
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 2})
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, num_speculative_tokens=k)
              for k in (0, 5, 1)]
    outs = llm.generate(prompts(3), params)
    assert [o.outputs[0].token_ids for o in outs] == reference[3]
    assert outs[0].metrics.num_draft_tokens == 0 and outs[1].metrics.num_draft_tokens > 0


def test_padded_baseline_gives_the_same_tokens(tiny_target, tiny_draft, reference):
    """The benchmark's padded mode wastes compute on pad tokens and keys but changes no output."""
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3},
              kv_cache_tokens=8192)
    llm.target.pad_batches = True
    outs = llm.generate(prompts(16), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference[16]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_speculative_equals_non_speculative_with_packed_weights(tiny_gguf_target, tiny_draft, method):
    """The same on a target whose weights run through the packed Q4_1/Q8_0 kernel."""
    plain = LLM(str(tiny_gguf_target), kv_cache_tokens=8192)
    assert plain.target.model.packed_weights
    want = [o.outputs[0].token_ids for o in plain.generate(prompts(6, seed=2), GREEDY)]
    cfg = {"method": method, "num_speculative_tokens": 3}
    if method == "draft_model":
        cfg["model"] = str(tiny_draft)
    outs = LLM(str(tiny_gguf_target), speculative_config=cfg, kv_cache_tokens=8192).generate(prompts(6, seed=2), GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
