"""Sampling through the engine: seeded determinism and statistical losslessness at temperature 1
with a negative control (DESIGN §8 tiers 2-3, end to end through draft and target workers)."""

import pytest
import torch

from specray import LLM, SamplingParams
from specray.kernels.verify import chain as verify

from router_helpers import PROMPT, chi2, exact_second_token_distribution, second_tokens


def make_llm(tiny_target, tiny_draft, k=3, **kw):
    return LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": k},
               kv_cache_tokens=65536, max_num_seqs=512, **kw)


def test_seeded_requests_reproduce_alone_or_in_a_batch(tiny_target, tiny_draft):
    llm = make_llm(tiny_target, tiny_draft)
    sp = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPT, sp)[0].outputs[0].token_ids
    others = [{"prompt_token_ids": [1, 5 + i, 9]} for i in range(5)]
    batch = llm.generate([*others[:2], PROMPT, *others[2:]], [SamplingParams(temperature=1.0, max_tokens=15)] * 2
                         + [sp] + [SamplingParams(temperature=1.0, max_tokens=15)] * 3)
    assert batch[2].outputs[0].token_ids == alone
    other_seed = llm.generate(PROMPT, SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=99,
                                                     ignore_eos=True))[0].outputs[0].token_ids
    assert other_seed != alone


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_seeded_requests_reproduce_whatever_the_load_turns_off(tiny_target, tiny_draft, method):
    """`disable_by_batch_size` stops drafting once two sequences run; a seeded sampled request keeps
    drafting, so its draws (and tokens) are those it gets alone (served: a concurrent request changed
    a seeded completion)."""
    spec = {"method": method, "num_speculative_tokens": 3, "disable_by_batch_size": 2}
    if method == "draft_model":
        spec["model"] = str(tiny_draft)
    llm = LLM(str(tiny_target), speculative_config=spec)
    sp = SamplingParams(temperature=1.0, max_tokens=24, seed=7, ignore_eos=True)
    alone = llm.generate(PROMPT, sp)[0]
    assert alone.metrics.num_draft_tokens > 0
    others = [{"prompt_token_ids": [1, 5 + i, 9]} for i in range(3)]
    batch = llm.generate([others[0], PROMPT, *others[1:]], [SamplingParams(temperature=1.0, max_tokens=30)]
                         + [sp] + [SamplingParams(temperature=1.0, max_tokens=30)] * 2)
    assert batch[1].outputs[0].token_ids == alone.outputs[0].token_ids
    assert sum(o.metrics.num_draft_tokens for o in batch[::2]) == 0  # the unseeded ones stopped drafting


def test_a_seeded_output_is_a_prefix_of_the_same_request_with_more_tokens(tiny_target, tiny_draft):
    """Its last round drafts as a longer request's would (max_tokens bounded the drafts, so the last
    round's draws, and tokens, depended on it), as plain decoding's outputs are prefixes."""
    llm = make_llm(tiny_target, tiny_draft, k=3)
    prompt = {"prompt_token_ids": [1, 5, 9, 5, 9, 5, 9, 5]}
    runs = {n: llm.generate(prompt, SamplingParams(temperature=1.0, max_tokens=n, seed=8, ignore_eos=True))[0]
            for n in range(8, 15)}
    longest = runs[14].outputs[0].token_ids
    assert all(r.outputs[0].token_ids == longest[:n] for n, r in runs.items())
    assert sum(r.metrics.num_draft_tokens for r in runs.values()) > 0


N = 12_000


@pytest.fixture(scope="module")
def sampling_llm(peaky_models):
    return make_llm(*peaky_models, k=3)


@pytest.mark.parametrize("pipelined", [False, True])
def test_engine_sampling_is_lossless(peaky_models, pipelined):
    sampling_llm = make_llm(*peaky_models, k=3, pipelined=pipelined)
    torch.manual_seed(0)
    want = exact_second_token_distribution(sampling_llm)
    assert chi2(second_tokens(sampling_llm, N), want) > 1e-3
    assert sampling_llm.draft is not None


def test_engine_negative_control_detected(sampling_llm, monkeypatch):
    torch.manual_seed(1)
    want = exact_second_token_distribution(sampling_llm)
    monkeypatch.setattr(verify, "residual_distribution", lambda q, p: q)
    # a third of the lossless test's samples leaves the control's p-value many orders below the bar
    assert chi2(second_tokens(sampling_llm, N // 3), want) < 1e-6


# -- feature-level (eagle) drafts -----------------------------------------------------------------
@pytest.fixture(scope="module")
def eagle_llm(peaky_models, tmp_path_factory):
    from eagle_helpers import save_tiny_eagle

    target, _ = peaky_models
    eagle = save_tiny_eagle(tmp_path_factory.mktemp("peaky_eagle"), target, seed=3, noise=0.2)
    return LLM(str(target), speculative_config={"method": "eagle", "model": str(eagle), "num_speculative_tokens": 3},
               kv_cache_tokens=65536, max_num_seqs=512)


def test_eagle_sampling_is_lossless(eagle_llm):
    torch.manual_seed(0)
    assert chi2(second_tokens(eagle_llm, N), exact_second_token_distribution(eagle_llm)) > 1e-3


def test_eagle_negative_control_detected(eagle_llm, monkeypatch):
    torch.manual_seed(1)
    want = exact_second_token_distribution(eagle_llm)
    monkeypatch.setattr(verify, "residual_distribution", lambda q, p: q)
    # a third of the lossless test's samples leaves the control's p-value many orders below the bar
    assert chi2(second_tokens(eagle_llm, N // 3), want) < 1e-6


def test_eagle_seeded_requests_reproduce_alone_or_in_a_batch(eagle_llm):
    sp = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=77, ignore_eos=True)
    alone = eagle_llm.generate(PROMPT, sp)[0].outputs[0].token_ids
    others = [{"prompt_token_ids": [1, 5 + i, 9]} for i in range(3)]
    batch = eagle_llm.generate([others[0], PROMPT, *others[1:]], [SamplingParams(temperature=1.0, max_tokens=15)]
                               + [sp] + [SamplingParams(temperature=1.0, max_tokens=15)] * 2)
    assert batch[1].outputs[0].token_ids == alone
