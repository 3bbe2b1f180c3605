"""SamplingParams.prompt_logprobs (vLLM's): each prompt token's logprob given the tokens before it, and
the top n, from the target's prefill rows; equal to the reference model's, whatever the chunking,
the batch or the speculation, and the outputs beside them unchanged."""

import pytest
import torch

from specray import LLM, SamplingParams
from specray.cluster.router.diffusion_router import DiffusionLimits

PROMPTS = [[1, 5, 9, 5, 9, 12, 7, 5, 9, 5, 9, 12, 40, 41], [3, 8, 8, 2, 30, 31, 32, 8, 8, 2], [17, 4]]
GREEDY = dict(temperature=0.0, max_tokens=6, ignore_eos=True)


def run(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [(o.prompt_logprobs, [c.token_ids for c in o.outputs], [c.logprobs for c in o.outputs]) for o in outs]


@pytest.fixture(scope="module")
def engines(tiny_target, tiny_draft):
    whole = LLM(str(tiny_target), kv_cache_tokens=1024, max_prefill_tokens=None)
    chunked = LLM(str(tiny_target), kv_cache_tokens=1024, max_prefill_tokens=3)
    spec = LLM(str(tiny_target), kv_cache_tokens=1024, max_prefill_tokens=4,
               speculative_config={"method": "draft_model", "model": str(tiny_draft), "num_speculative_tokens": 3})
    return whole, chunked, spec


def test_prompt_logprobs_are_the_reference_model_s(engines, tiny_target):
    from transformers import LlamaForCausalLM

    out = engines[0].generate({"prompt_token_ids": PROMPTS[0]}, SamplingParams(**GREEDY, prompt_logprobs=3))[0]
    ids = PROMPTS[0]
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    model = LlamaForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].log_softmax(-1)  # [len(ids), vocab_size]
    for i in range(1, len(ids)):
        entry = out.prompt_logprobs[i]
        assert entry[ids[i]].logprob == pytest.approx(float(ref[i - 1, ids[i]]), abs=1e-4)
        top = ref[i - 1].topk(3)
        ranked = sorted((lp.rank, t) for t, lp in entry.items() if t != ids[i] or t in top.indices.tolist())
        assert [t for _, t in ranked] == top.indices.tolist()
        assert len(entry) == 3 + (ids[i] not in top.indices.tolist())
        assert entry[ids[i]].rank == int((ref[i - 1] >= ref[i - 1, ids[i]]).sum())  # vLLM's: its vocabulary rank


def test_the_same_whatever_the_chunking_the_batch_and_the_speculation(engines):
    """Bit for bit: prompt rows computed in chunks of 3, beside other prompts, or with a draft
    verifying, are the rows of the whole prompt alone; the outputs match plain decoding's."""
    params = SamplingParams(**GREEDY, prompt_logprobs=2, logprobs=1)
    alone = [run(engines[0], [p], params)[0] for p in PROMPTS]
    for engine in engines:
        assert run(engine, PROMPTS, params) == alone
    plain = run(engines[0], PROMPTS, SamplingParams(**GREEDY))
    mixed = run(engines[2], PROMPTS, [SamplingParams(**GREEDY), params, SamplingParams(**GREEDY)])
    assert [m[1] for m in mixed] == [p[1] for p in plain]
    assert mixed[0][0] is None and mixed[1] == alone[1]


def test_prompt_logprobs_zero_and_n_choices(engines):
    out = engines[1].generate({"prompt_token_ids": PROMPTS[1]}, SamplingParams(**GREEDY, n=2, prompt_logprobs=0))[0]
    assert len(out.outputs) == 2 and len(out.prompt_logprobs) == len(PROMPTS[1])
    assert all(list(e) == [t] for e, t in zip(out.prompt_logprobs[1:], PROMPTS[1][1:]))


@pytest.mark.parametrize("value", [-1, 21, True, 1.5])
def test_bad_prompt_logprobs_are_refused_by_name(value):
    with pytest.raises(ValueError, match="^prompt_logprobs must be an integer in"):
        SamplingParams(prompt_logprobs=value)


def test_a_diffusion_lm_refuses_prompt_logprobs():
    with pytest.raises(ValueError, match="prompt_logprobs are not defined for a diffusion LM"):
        DiffusionLimits(64, 100, 8).check_request([1, 2], SamplingParams(prompt_logprobs=1))


def test_a_diffusion_lm_refuses_max_tokens_none():
    """vLLM's "up to the model's length" made the canvas the whole context: 8k masks, minutes a block."""
    with pytest.raises(ValueError, match="max_tokens=None would make a diffusion LM's canvas the whole context"):
        DiffusionLimits(64, 100, 8).check_request([1, 2], SamplingParams(max_tokens=None))
