"""vLLM code ported as it is: SamplingParams takes vLLM's fields at their no-op values (and refuses any
other by name), max_tokens None runs to the model's length, a request keeps the parameters it was added
with, logprobs are vLLM-shaped `Logprob`s, dtype "auto" loads."""

import pickle

import pytest

from specray import LLM, Logprob, SamplingParams
from specray.cluster.params import NO_OP_FIELDS

PROMPT = [1, 5, 9, 5, 9, 12]
VLLM_DEFAULTS = dict(presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, min_p=0.0, min_tokens=0,
                     best_of=None, logit_bias=None, bad_words=None, allowed_token_ids=None, prompt_logprobs=None,
                     truncate_prompt_tokens=None, logits_processors=None, detokenize=True,
                     spaces_between_special_tokens=True)


@pytest.fixture(scope="module")
def llm(tiny_target):
    return LLM(str(tiny_target), kv_cache_tokens=1024, max_model_len=32, dtype="auto")


def test_vllm_defaults_spelled_out_change_nothing(llm):
    greedy = dict(temperature=0.0, max_tokens=6, ignore_eos=True)
    want = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**greedy))[0].outputs[0].token_ids
    got = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**greedy, **VLLM_DEFAULTS))[0]
    assert got.outputs[0].token_ids == want and len(want) == 6


@pytest.mark.parametrize("field, value", [("best_of", 2),
                                          ("logits_processors", [print]), ("guided_decoding", {"json": {}}),
                                          ("detokenize", False), ("spaces_between_special_tokens", False)])
def test_a_vllm_field_that_would_change_the_output_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"^{field}=.* is not supported by specray") as e:
        SamplingParams(**{field: value})
    assert e.value.param == field


def test_every_no_op_field_is_a_sampling_params_field():
    params = SamplingParams()
    assert all(getattr(params, name) == no_ops[0] for name, no_ops in NO_OP_FIELDS.items())


def test_max_tokens_none_runs_to_the_model_length(llm):
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0.0, max_tokens=None,
                                                                    ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 32 - len(PROMPT) and out.finish_reason == "length" and out.finished()


def test_a_running_request_keeps_the_parameters_it_was_added_with(llm):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = []
    for out in llm.stream({"prompt_token_ids": PROMPT}, params):
        params.max_tokens = 2  # the next request's, not this one's
        outs.append(out)
    assert len(outs[-1].outputs[0].token_ids) == 8 and not outs[0].outputs[0].finished()


def test_logprobs_are_vllm_logprobs(llm):
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, logprobs=1)
    out = llm.generate({"prompt_token_ids": PROMPT}, params)[0].outputs[0]
    assert len(out.logprobs) == 12
    outside = 0
    for token, position in zip(out.token_ids, out.logprobs):
        assert all(isinstance(lp, Logprob) and lp.logprob == float(lp) for lp in position.values())
        assert all(lp.decoded_token == tok.decode([t]) for t, lp in position.items())
        ranked = sorted(position.values(), key=lambda lp: -lp.logprob)
        assert ranked[0].rank == 1 and max(lp.logprob for lp in position.values()) == ranked[0].logprob
        if len(position) == 2:  # the drawn token ranked below the top 1: its rank in the vocabulary
            outside += 1
            assert position[token].rank >= 2 and ranked[0] is not position[token]
    assert outside  # a sampled run of 12 draws some token outside the top 1 (seeded)
    assert out.cumulative_logprob == pytest.approx(sum(p[t].logprob for p, t in zip(out.logprobs, out.token_ids)))
    again = pickle.loads(pickle.dumps(out.logprobs[0]))
    assert again == out.logprobs[0] and [lp.rank for lp in again.values()] == [lp.rank for lp in out.logprobs[0].values()]


def test_ties_rank_as_vllm_ranks_them():
    """Three tokens tied (common in bf16): the top 2 rank 1 and 2 and the drawn one outside them 3;
    the drawn token ranked 1 and, sorting first by id, pushed a top-2 token to rank None."""
    import torch

    from specray.actors.step_rows import logprob_entries
    from specray.cluster.outputs import ranked

    tied = torch.tensor([[0.0, -2.0, 1.0, 1.0, 1.0]])  # tokens 2, 3, 4 tied; topk(2) takes two of them
    entry = logprob_entries(tied, [2], 2)[0]
    assert entry.rank == 3
    got = {t: lp.rank for t, lp in ranked(entry, 2, lambda t: None).items()}
    top = [t for t in entry if t != 2]
    if len(entry) == 2:  # topk took the drawn token: the places rank
        assert sorted(got.values()) == [1, 2]
    else:
        assert got[2] == 3 and sorted(got[t] for t in top) == [1, 2]
    inside = logprob_entries(torch.tensor([[0.0, -2.0, 3.0, 1.0]]), [2], 2)[0]  # drawn, the most likely
    assert inside.rank == 1 and {t: lp.rank for t, lp in ranked(inside, 2, lambda t: None).items()} == {2: 1, 3: 2}


def test_streamed_logprobs_are_converted_once_and_forgotten(llm):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=2)
    first = None
    for out in llm.stream({"prompt_token_ids": PROMPT}, params):
        first = first or out.outputs[0].logprobs[0]
        assert all(isinstance(lp, Logprob) for p in out.outputs[0].logprobs for lp in p.values())
    assert out.outputs[0].logprobs[0] is first and len(out.outputs[0].logprobs) == 5
    assert not llm._logprobs.top_n and not llm._logprobs.converted


@pytest.mark.parametrize("field", ["stop", "stop_token_ids"])
def test_too_many_stops_name_their_field(field):
    with pytest.raises(ValueError, match="at most 64 stop strings") as e:
        SamplingParams(**{field: [f"w{i}" if field == "stop" else i for i in range(65)]})
    assert e.value.param == field


def test_seeds_take_the_int64_and_uint64_ranges_and_fold_into_the_pools_range(llm):
    """vLLM and OpenAI take negative seeds, our gRPC API uint64 ones: choice i draws with (seed + i) mod 2^63."""
    sampled = dict(temperature=1.0, max_tokens=6, ignore_eos=True, n=2)

    def draws(seed):
        out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**sampled, seed=seed))[0]
        return [c.token_ids for c in out.outputs]

    assert draws(-1) == draws(2**63 - 1) == draws(2**64 - 1)  # all fold to 2^63 - 1, choice 1 to 0
    assert draws(-1)[1] == draws(0)[0] and draws(-2**63) == draws(0)
    assert draws(-1) != draws(5)  # the fold keeps seeds apart: not one stream for every negative seed


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(llm):
    """As vLLM's: the prompt is cut from the left before it runs; the output and its prompt ids are
    those of the kept tokens alone."""
    long = [3 + (7 * i) % 60 for i in range(40)]  # longer than the model's 32 positions
    greedy = dict(temperature=0.0, max_tokens=5, ignore_eos=True)
    want = llm.generate({"prompt_token_ids": long[-9:]}, SamplingParams(**greedy))[0]
    got = llm.generate({"prompt_token_ids": long}, SamplingParams(**greedy, truncate_prompt_tokens=9))[0]
    assert got.prompt_token_ids == long[-9:] and got.outputs[0].token_ids == want.outputs[0].token_ids
    short = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(**greedy, truncate_prompt_tokens=20))[0]
    assert short.prompt_token_ids == PROMPT  # shorter than k: whole
    with pytest.raises(ValueError, match="context.*truncate_prompt_tokens=-1 kept the last 32 of its 40"):
        llm.generate({"prompt_token_ids": long}, SamplingParams(**greedy, truncate_prompt_tokens=-1))  # no room left
    with pytest.raises(ValueError, match="greater than the model's length") as e:
        llm.generate({"prompt_token_ids": long}, SamplingParams(**greedy, truncate_prompt_tokens=33))
    assert e.value.__cause__ is None


def test_a_truncated_text_prompt_reports_the_tokens_it_kept(llm):
    out = llm.generate("w5 w6 w7 w8 w9", SamplingParams(temperature=0.0, max_tokens=2, truncate_prompt_tokens=2))[0]
    assert len(out.prompt_token_ids) == 2 and out.prompt is None  # the text no longer spells the prompt


@pytest.mark.parametrize("value", [0, -2, True, "5", 2.0])
def test_a_bad_truncate_prompt_tokens_is_refused_by_name(value):
    with pytest.raises(ValueError, match="^truncate_prompt_tokens must be") as e:
        SamplingParams(truncate_prompt_tokens=value)
    assert e.value.param == "truncate_prompt_tokens"


def test_a_truncate_prompt_tokens_changed_after_construction_is_refused_by_name(llm):
    params = SamplingParams(max_tokens=2)
    params.truncate_prompt_tokens = "5"
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be"):
        llm.generate({"prompt_token_ids": PROMPT}, params)
