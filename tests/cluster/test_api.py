"""Offline API behaviour: bad input, stops, logprobs, chat templates, n, abort (streams: test_api_streams.py)."""

import pytest

from specray import LLM, SamplingParams
from specray.kernels.loader import ModelNotFoundError
from helpers import text_after

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_target, tiny_draft):
    return LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3},
               max_model_len=64, kv_cache_tokens=4096)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(n=0), "n must"),
    (dict(num_speculative_tokens=-1), "num_speculative_tokens"),
    (dict(stop=5), "stop must be a string or a list"),
    (dict(stop_token_ids=5), "stop_token_ids must be a list"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("config, message", [
    ({"method": "eagle9"}, "unknown speculative method"),
    ({"method": "none"}, r"null \(or leaving it out\) turns speculation off"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "draft_model"}, "needs a draft"),
    ({"method": "ngram", "bogus": 1}, "unknown speculative_config keys"),
    ({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup"),
    ({"method": "ngram", "prompt_lookup_min": "2"}, "prompt_lookup_min must be an integer, got '2'"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": 100000}, r"num_speculative_tokens must be an integer in \[1, "),
    ("ngram", "speculative_config must be a dict"),
    ({"method": "aded", "model": "smollm2-135m-draft"}, "method 'aded' drafts without a model: drop 'model'"),
    ({"method": "ngram", "model": "x"}, "method 'ngram' drafts without a model"),
    ({"method": "draft_model", "model": "x", "num_speculative_tokens": 3,  # failed allocating the draft's KV
      "tree": {"kind": "rsd_c", "branching": [1000, 1000, 1000]}}, "up to 1001001000 tokens a sequence; at most 4096"),
    ({"method": "eagle", "model": "smollm2-135m-eagle", "prompt_lookup_max": 8},  # was ignored
     r"\['prompt_lookup_max'\] shape prompt lookup \(method 'ngram'\); method 'eagle' would ignore them"),
])
def test_bad_speculative_config(tiny_target, config, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_target), speculative_config=config)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_num_seqs=0), "max_num_seqs must be an integer >= 1, got 0"),
    (dict(kernels="fast", dtype="bfloat16"), "kernels='fast' runs the C kernels on fp32 weights; dtype bfloat16"),
    (dict(kernels="fast16", dtype="float16"), "kernels='fast16' runs the C kernels on fp32 weights; dtype float16"),
    (dict(kernels="fast8"), r"kernels must be one of \('auto', 'exact', 'fast16', 'fast'\), got 'fast8'"),
])
def test_engine_arguments_that_could_not_run_are_refused(tiny_target, kwargs, message):
    """A bare assertion deep in the router, and a fast mode silently dropped for plain torch, before."""
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_target), **kwargs)


def test_fast_kernels_on_a_gpu_are_refused_not_dropped(monkeypatch):
    import torch

    from specray.cluster.llm_inputs import check_engine_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the check, not a device, is under test
    for mode in ("fast", "fast16"):
        with pytest.raises(ValueError, match=f"kernels='{mode}' is a CPU kernels' mode; on 'cuda' it would do nothing"):
            check_engine_args("cuda", 1024, 16, kernels=mode)
    check_engine_args("cuda", 1024, 16, kernels="exact")


def test_unknown_model():
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        LLM("no-such-model-anywhere")


def test_a_missing_draft_fails_before_the_target_loads(tiny_target, monkeypatch):
    import specray.cluster.llm as llm_module

    monkeypatch.setattr(llm_module, "load_model", lambda *a, **k: pytest.fail("the target must not load"))
    with pytest.raises(ModelNotFoundError, match="no-such-draft"):
        LLM(str(tiny_target), speculative_config={"method": "draft_model", "model": "no-such-draft"})


def test_bad_prompts_raise_before_anything_runs(llm):
    with pytest.raises(ValueError, match="prompt 1: prompt is empty"):
        llm.generate([{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": []}], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="context"):
        llm.generate({"prompt_token_ids": [3] * 64}, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 97\)"):
        llm.generate({"prompt_token_ids": [3, 500]}, SamplingParams(max_tokens=2))
    assert not llm.router.has_unfinished()


@pytest.mark.parametrize("prompts, params, message", [
    (["w3"], {"max_tokens": 3}, "sampling_params must be a SamplingParams or a list of them .* got dict"),
    (["w3", "w4"], [SamplingParams()], "one per prompt: 1 for 2 prompts"),
    (None, None, "prompts must be .* got NoneType"), (5, None, "got int"),
    (["w3", "w4 \udcff"], None, "prompt 1: text: not valid Unicode text"),  # the tokenizer raised TypeError
    # vLLM's prompt dicts: what specray would ignore is refused, a wrong type named with its index
    ([{"prompt": "w3", "multi_modal_data": {"image": 1}}], None, r"prompt 0: prompt keys \['multi_modal_data'\]"),
    ([{"prompt_embeds": [[0.1]]}], None, r"prompt 0: prompt keys \['prompt_embeds'\] are not supported"),
    (["w3", {"prompt_token_ids": 5}], None, "prompt 1: prompt_token_ids must be a list of token ids, got int"),
    ([{}], None, "prompt 0: a prompt dict needs 'prompt' .* or 'prompt_token_ids'"),
])
def test_bad_arguments_are_one_value_error(llm, prompts, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, params)
    assert not llm.router.has_unfinished()


def test_chat_without_a_tokenizer_says_so(tiny_target):
    """It said the model had no chat template."""
    with pytest.raises(ValueError, match="no tokenizer"):
        LLM(str(tiny_target), skip_tokenizer_init=True).chat([{"role": "user", "content": "hi"}])


def test_a_draft_with_another_vocabulary_is_refused(tiny_target, tmp_path):
    """It loaded, accepted nothing greedy and failed every sampled request in verification."""
    from helpers import save_tiny_llama

    other = save_tiny_llama(tmp_path / "other", seed=2, vocab_size=113)
    with pytest.raises(ValueError, match="vocab_size 113, the target.s is 97: a draft must share"):
        LLM(str(tiny_target), speculative_config={"method": "draft_model", "model": str(other)})


@pytest.mark.parametrize("method, draft, says", [
    ("draft_model", "smollm2-135m-dllm", "is a diffusion LM: it serves on its own"),  # transformers' "upgrade" advice
    ("draft_model", "smollm2-135m-eagle", "is a feature-level draft"),
])
def test_the_engine_checks_a_draft_as_serve_does(tiny_target, method, draft, says):
    with pytest.raises(ValueError, match=says):
        LLM(str(tiny_target), speculative_config={"method": method, "model": draft})


def test_a_feature_level_draft_is_refused_as_the_model():
    """It has no layers of its own: loading it failed on a missing embedding (KeyError)."""
    with pytest.raises(ValueError, match="is a feature-level draft .* --speculative-method eagle"):
        LLM("smollm2-135m-eagle")


def test_bad_request_does_not_disturb_running_ones(llm):
    sp = SamplingParams(max_tokens=20, **GREEDY)
    want = llm.generate({"prompt_token_ids": [1, 8, 9, 10]}, sp)[0].outputs[0].token_ids
    rid = llm.router.add_request([1, 8, 9, 10], sp)
    llm.router.step()
    llm.router.step()
    with pytest.raises(ValueError):
        llm.router.add_request([], sp)
    with pytest.raises(ValueError):
        llm.router.add_request([1] * 100, sp)
    final = None
    while llm.router.has_unfinished():
        for out in llm.router.step():
            final = out if out.request_id == rid else final
    assert final.finished and final.outputs[0].token_ids == want


def test_length_is_capped_by_the_context(llm):
    out = llm.generate({"prompt_token_ids": [1] * 60}, SamplingParams(max_tokens=50, **GREEDY))[0]
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].finish_reason == "length"


def test_stop_token_and_stop_string(llm, tiny_target):
    base = llm.generate({"prompt_token_ids": [1, 8, 9, 10]}, SamplingParams(max_tokens=20, **GREEDY))[0]
    ids, text = base.outputs[0].token_ids, base.outputs[0].text
    stop_tok = ids[5]
    out = llm.generate({"prompt_token_ids": [1, 8, 9, 10]},
                       SamplingParams(max_tokens=20, stop_token_ids=[stop_tok], **GREEDY))[0].outputs[0]
    assert out.token_ids == ids[: ids.index(stop_tok) + 1] and out.finish_reason == "stop"
    assert out.stop_reason == stop_tok
    # vLLM's text: the stop token's own left out unless include_stop_str_in_output
    tok = llm.get_tokenizer()
    prompt = [1, 8, 9, 10]
    assert out.text == text_after(tok, prompt, out.token_ids[:-1]) != text_after(tok, prompt, out.token_ids)
    kept = llm.generate({"prompt_token_ids": [1, 8, 9, 10]}, SamplingParams(
        max_tokens=20, stop_token_ids=[stop_tok], include_stop_str_in_output=True, **GREEDY))[0].outputs[0]
    assert kept.token_ids == out.token_ids and kept.text == text_after(tok, prompt, out.token_ids)
    word = text.split()[3]
    out = llm.generate({"prompt_token_ids": [1, 8, 9, 10]},
                       SamplingParams(max_tokens=20, stop=[word], **GREEDY))[0].outputs[0]
    assert out.text == text[: text.index(word)] and out.finish_reason == "stop" and out.stop_reason == word
    # the ids end at the token that completes the stop string, as plain decoding's do (rounds of the
    # 3-token draft emitted past it)
    tok = llm.get_tokenizer()
    assert word in tok.decode(out.token_ids) and word not in tok.decode(out.token_ids[:-1])
    plain = LLM(str(tiny_target), max_model_len=64).generate(
        {"prompt_token_ids": [1, 8, 9, 10]}, SamplingParams(max_tokens=20, stop=[word], **GREEDY))[0].outputs[0]
    assert (out.token_ids, out.text) == (plain.token_ids, plain.text)


def test_a_stop_string_ends_the_ids_where_plain_decoding_ends_them(tiny_target):
    """n-gram accepts the tiny model's repeats, so a round emits past the token that completes the
    stop string: ids, usage and text still end where plain decoding's do."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    params = SamplingParams(max_tokens=20, stop=["w15 w15 w15"], **GREEDY)
    spec, plain = (LLM(str(tiny_target), speculative_config=c, max_model_len=64).generate(
        ["w20 w21 w22 w20 w21"], params)[0].outputs[0] for c in (ngram, None))
    assert (spec.token_ids, spec.text, spec.finish_reason) == (plain.token_ids, plain.text, "stop")


def test_eos_stops_unless_ignored(tiny_target):
    llm = LLM(str(tiny_target))
    free_run = llm.generate({"prompt_token_ids": [1, 8, 9]}, SamplingParams(max_tokens=12, **GREEDY))[0]
    eos = free_run.outputs[0].token_ids[3]
    llm.router.eos_token_ids = frozenset({eos})
    out = llm.generate({"prompt_token_ids": [1, 8, 9]}, SamplingParams(max_tokens=12, temperature=0.0))[0]
    assert out.outputs[0].token_ids[-1] == eos and out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].stop_reason is None  # vLLM's: the stop string or stop token id, None at EOS
    also = llm.generate({"prompt_token_ids": [1, 8, 9]}, SamplingParams(max_tokens=12, temperature=0.0,
                                                                      stop_token_ids=[eos]))[0].outputs[0]
    assert also.token_ids == out.outputs[0].token_ids and also.stop_reason is None


def test_logprobs_and_n(llm):
    sp = SamplingParams(max_tokens=6, logprobs=2, n=3, temperature=1.0, seed=7, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": [1, 8, 9, 10]}, sp)[0]
    assert len(out.outputs) == 3 and [c.index for c in out.outputs] == [0, 1, 2]
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 6
        for tok, lp in zip(c.token_ids, c.logprobs):
            assert tok in lp and len(lp) <= 3 and all(v <= 0 for v in lp.values())
        assert c.cumulative_logprob == pytest.approx(sum(lp[t] for lp, t in zip(c.logprobs, c.token_ids)))


def test_chat_template(llm):
    ids = llm.apply_chat_template([{"role": "user", "content": "w10 w11"}])
    assert llm.get_tokenizer().decode(ids) == "w3 w10 w11 w4 w5"
    out = llm.chat([{"role": "user", "content": "w10 w11"}], SamplingParams(max_tokens=5, **GREEDY))[0]
    assert out.prompt_token_ids == ids and len(out.outputs[0].token_ids) == 5
    assert out.prompt == "w3 w10 w11 w4 w5"  # the rendered conversation, as vLLM reports a chat's prompt


def test_abort_frees_the_sequence(llm):
    rid = llm.router.add_request([1, 8, 9, 10], SamplingParams(max_tokens=30, **GREEDY))
    llm.router.step()
    llm.router.step()
    llm.router.abort(rid)
    assert not llm.router.has_unfinished() and llm.router.reserved_tokens == 0
    assert llm.target.cache.num_free_blocks == llm.target.cache.num_blocks


def test_incremental_text_equals_full_decode(llm):
    """The text is what the output reads as after the prompt: its first word's leading space too (a
    SentencePiece tokenizer drops it from a decode that starts there; vLLM keeps it)."""
    out = llm.generate({"prompt_token_ids": [1, 8, 9, 10]}, SamplingParams(max_tokens=30, **GREEDY))[0].outputs[0]
    assert out.text == text_after(llm.get_tokenizer(), [1, 8, 9, 10], out.token_ids) and out.text.startswith(" ")


@pytest.mark.parametrize("messages, message", [
    ([], "messages is empty"), ([{"role": "user"}], "message 0: needs a string 'role' and 'content'"),
    ([[{"role": "user", "content": "hi"}], "hi"], "conversation 1"),
    ([{"role": "user", "content": "\udcff"}], "message 0, content: not valid Unicode text"),
    ([{"role": "wizard", "content": "hi"}], "role must be one of"),  # as HTTP and gRPC refuse it
])
def test_chat_refuses_malformed_messages(llm, messages, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(messages)


def test_the_context_is_cut_to_what_the_kv_cache_holds(tiny_target):
    """As vLLM: an unset max_model_len is the model's context cut to the KV cache, whatever the
    speculation, so a request without max_tokens fits and stops where plain decoding's does; a set
    one the cache cannot hold is refused at start-up."""
    small = LLM(str(tiny_target), kv_cache_tokens=32)
    assert small.router.config.max_model_len == 31
    out = small.generate({"prompt_token_ids": [1] * 20}, SamplingParams(max_tokens=50, **GREEDY))[0].outputs[0]
    assert len(out.token_ids) == 11 and out.finish_reason == "length"
    # speculation takes no context: a request stops where plain decoding's does (it drafts less near the end)
    spec = LLM(str(tiny_target), kv_cache_tokens=32, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert spec.router.config.max_model_len == 31
    both = spec.generate({"prompt_token_ids": [1] * 20}, SamplingParams(max_tokens=50, **GREEDY))[0]
    assert (both.outputs[0].token_ids, both.outputs[0].finish_reason) == (out.token_ids, out.finish_reason)
    assert both.metrics.num_draft_tokens > 0  # it drafted, within the slots the cache holds
    with pytest.raises(ValueError, match="max_model_len 40 does not fit in the KV cache"):
        LLM(str(tiny_target), kv_cache_tokens=32, max_model_len=40)
