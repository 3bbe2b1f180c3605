"""The OpenAI-compatible HTTP API's request fields: a refused one named in the error's `param`, null
options taking their defaults, chat content parts."""

import httpx
import pytest

from specray import SamplingParams

from openai_helpers import KEY, MESSAGES, offline, served  # noqa: F401 - fixtures

@pytest.mark.parametrize("field, value", [("max_tokens", -3), ("temperature", -1), ("top_p", 2.0), ("n", 0),
                                          ("stop", [""]), ("seed", 2**64)])
def test_a_refused_sampling_parameter_is_named_in_param(field, value):
    """OpenAI's error body names the offending field in `param`, as for the schema's own errors."""
    from specray.cluster.serve.openai_protocol import ApiError, ChatRequest

    body = ChatRequest(messages=[{"role": "user", "content": "hi"}], **{field: value})
    with pytest.raises(ApiError) as e:
        body.sampling_params(16, None)
    assert e.value.status == 400 and e.value.param == field and field in str(e.value)


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"messages": MESSAGES, "stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MESSAGES, "include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ({"messages": MESSAGES, "chat_template": "{{ messages }}"}, "chat_template"),
    ({"messages": MESSAGES, "use_beam_search": True}, "use_beam_search"),
    ({"messages": MESSAGES, "structured_outputs": {"choice": ["a"]}}, "structured_outputs"),
    ({"messages": [{"role": "user", "content": "w5 " * 600}]}, "messages"),  # fills the context alone
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]}, "messages[0].tool_calls"),
    ({"messages": MESSAGES, "detokenize": False}, "detokenize"),
    ({"messages": MESSAGES, "verbosity": "low"}, "verbosity"),
    ({"messages": MESSAGES, "modalities": ["text", "audio"]}, "modalities"),
    ({"messages": MESSAGES, "logit_bias": {"w5": 1.0}}, "logit_bias"),
    ({"messages": MESSAGES, "logit_bias": {"5": 500}}, "logit_bias"),
    ({"messages": MESSAGES, "min_p": 2}, "min_p"),
    ({"messages": MESSAGES, "num_drafts": 4}, "num_drafts"),  # the server's settings were ignored
    ({"messages": MESSAGES, "speculative_config": {"method": "ngram"}}, "speculative_config"),
    ({"messages": MESSAGES, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    # vLLM's serving options it would act on: refused, not dropped
    ({"messages": MESSAGES, "request_id": "r" * 257}, "request_id"),  # it goes out in every chunk
    ({"messages": MESSAGES, "cache_salt": ""}, "cache_salt"),
    ({"messages": MESSAGES, "cache_salt": 5}, "cache_salt"),
    ({"messages": MESSAGES, "priority": 5}, "priority"),
    ({"messages": MESSAGES, "documents": [{"text": "w7"}]}, "documents"),
    ({"messages": MESSAGES, "return_token_ids": True}, "return_token_ids"),
    ({"messages": MESSAGES, "vllm_xargs": {"a": 1}}, "vllm_xargs"),
    ({"messages": [{"role": "assistant", "content": None, "function_call": {"name": "f"}}]},
     "messages[0].function_call"),
])
def test_a_request_refused_names_its_field(served, body, param):
    resp = httpx.post(served[0].url + "/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, **body},
                      headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


@pytest.mark.parametrize("body, param", [
    ({"prompt": [10**6]}, "prompt"),  # token ids the vocabulary lacks: the router's own check
    ({"prompt": "w5", "n": 10**3}, "n"),
    ({"prompt": "w5 " * 600}, "prompt"),  # the prompt fills the context alone: not max_tokens' fault
    ({"prompt": [[5], [10**6]]}, "prompt[1]"),  # one of several prompts: which one
    ({"prompt": [[5], [10**6]], "stream": True}, "prompt[1]"),
    ({"prompt": "w5", "logit_bias": {str(10**6): 1.0}}, "logit_bias"),
    ({"prompt": "w5", "allowed_token_ids": [5, 10**6]}, "allowed_token_ids"),
    ({"prompt": "w5", "bad_words": [" "]}, "bad_words"),
    ({"prompt": "w5", "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),  # past the model's length
])
def test_the_routers_refusals_name_their_field(served, body, param):
    resp = httpx.post(served[0].url + "/v1/completions", json={"model": "tiny", "max_tokens": 2, **body},
                      headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


def test_null_options_take_their_defaults(served, offline):
    """OpenAI's options are nullable and clients send unset ones as null: null is the default, not a
    type error; a required field's null is still refused."""
    headers = {"Authorization": f"Bearer {KEY}"}
    nulls = {k: None for k in ("temperature", "top_p", "top_k", "n", "stream", "stop", "seed", "stop_token_ids",
                               "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "stream_options")}
    want = offline.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=6))[0].outputs[0].text
    chat = httpx.post(served[0].url + "/v1/chat/completions", headers=headers,
                      json={"model": "tiny", "messages": MESSAGES, "max_tokens": 6, **nulls, "temperature": 0,
                            "logprobs": None, "top_logprobs": None, "max_completion_tokens": None})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] == want and len(chat.json()["choices"]) == 1
    sampled = httpx.post(served[0].url + "/v1/completions", headers=headers,
                         json={"model": "tiny", "prompt": "w20 w21", "max_tokens": 4, **nulls, "logprobs": None})
    assert sampled.status_code == 200 and sampled.json()["choices"][0]["logprobs"] is None
    refused = httpx.post(served[0].url + "/v1/completions", headers=headers,
                         json={"model": "tiny", "prompt": None, "max_tokens": 4})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"


def test_text_content_parts_are_joined_by_newlines(served):
    """As vLLM: a message's text parts make one text, a newline between two parts."""
    headers = {"Authorization": f"Bearer {KEY}"}
    parts = [{"type": "text", "text": "w10 w11"}, {"type": "text", "text": "w12"}]
    usage = [httpx.post(served[0].url + "/v1/chat/completions", headers=headers, json={
        "model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}).json()["usage"]
        for content in (parts, "w10 w11\nw12", "w10 w11w12")]
    assert usage[0]["prompt_tokens"] == usage[1]["prompt_tokens"] != usage[2]["prompt_tokens"]


def test_no_op_values_of_vllms_and_openais_options_are_taken(served):
    """top_logprobs 0 without logprobs asks for nothing (clients send it by default), modalities
    ["text"] is the only output there is, and a participant's name goes to the chat template."""
    headers = {"Authorization": f"Bearer {KEY}"}
    for extra in ({"top_logprobs": 0}, {"modalities": ["text"]}, {"detokenize": True}, {"priority": 0},
                  {"cache_salt": None}, {"return_token_ids": False},
                  {"messages": [{"role": "user", "content": "w5", "name": "ann"}]}):
        resp = httpx.post(served[0].url + "/v1/chat/completions", headers=headers,
                          json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2, **extra})
        assert resp.status_code == 200 and resp.json()["choices"][0]["logprobs"] is None, (extra, resp.text)


def test_a_messages_name_reaches_the_template():
    from specray.cluster.serve.openai_protocol import ApiError, ChatMessage

    assert ChatMessage(role="user", content="hi", name="ann").template_fields(0) == {
        "role": "user", "content": "hi", "name": "ann"}
    assert ChatMessage(role="user", content="hi", tool_calls=[]).template_fields(0) == {"role": "user", "content": "hi"}
    with pytest.raises(ApiError) as e:  # a lone surrogate cannot reach the tokenizer
        ChatMessage(role="user", content="hi", name="\ud800").template_fields(2)
    assert e.value.param == "messages[2].name"


def test_a_requests_verify_budget_reaches_the_router(served):
    """It was dropped: a request's budget of 1 verified draft token a round against the server's 3."""
    headers = {"Authorization": f"Bearer {KEY}"}
    usage = [httpx.post(served[0].url + "/v1/completions", headers=headers, json={
        "model": "tiny", "prompt": "w5 w6 w7", "max_tokens": 24, "temperature": 0, "ignore_eos": True, **extra,
    }).json()["usage"] for extra in ({}, {"verify_budget": 1})]
    assert usage[0]["speculative"]["num_draft_tokens"] > usage[0]["completion_tokens"]  # 3 a round
    assert 0 < usage[1]["speculative"]["num_draft_tokens"] <= usage[1]["completion_tokens"]  # 1 a round
    bad = httpx.post(served[0].url + "/v1/completions", headers=headers,
                     json={"model": "tiny", "prompt": "w5", "max_tokens": 2, "verify_budget": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "verify_budget"


def test_logit_bias_and_min_p_answer_as_the_offline_api(served, offline):
    """OpenAI's logit_bias (token ids as string keys) and vLLM's min_p reach the target's rows."""
    plain = offline.generate("w5 w6", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    banned = plain.outputs[0].token_ids[0]
    want = offline.generate("w5 w6", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, min_p=0.1,
                                                    logit_bias={banned: -100}))[0].outputs[0]
    assert want.token_ids[0] != banned
    resp = httpx.post(served[0].url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "tiny", "prompt": "w5 w6", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                            "min_p": 0.1, "logit_bias": {str(banned): -100}})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == want.text, resp.text


def test_penalties_and_min_tokens_answer_as_the_offline_api(served, offline):
    first = offline.generate("w5 w6 w5 w6", SamplingParams(temperature=0, max_tokens=2))[0].outputs[0].token_ids[0]
    penalties = dict(presence_penalty=0.5, frequency_penalty=1.0, repetition_penalty=1.5, min_tokens=3,
                     stop_token_ids=[first])
    want = offline.generate("w5 w6 w5 w6", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **penalties))
    plain = offline.generate("w5 w6 w5 w6", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert want[0].outputs[0].text != plain[0].outputs[0].text
    resp = httpx.post(served[0].url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "tiny", "prompt": "w5 w6 w5 w6", "max_tokens": 12, "temperature": 0,
                            "ignore_eos": True, **penalties})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == want[0].outputs[0].text, resp.text


def test_truncate_prompt_tokens_answers_as_the_offline_api(served, offline):
    """vLLM's truncate_prompt_tokens: the completion of the prompt's last k tokens, k prompt tokens in
    the usage, and a chat cut after its template is applied; a prompt past the context fits again."""
    ids = offline.get_tokenizer().encode("w5 w6 w7 w8 w9 w10 w11")
    params = dict(temperature=0, max_tokens=4, ignore_eos=True)
    want = offline.generate({"prompt_token_ids": ids[-3:]}, SamplingParams(**params))[0].outputs[0]
    headers = {"Authorization": f"Bearer {KEY}"}
    resp = httpx.post(served[0].url + "/v1/completions", headers=headers,
                      json={"model": "tiny", "prompt": ids, "truncate_prompt_tokens": 3, **params})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == want.text, resp.text
    assert resp.json()["usage"]["prompt_tokens"] == 3
    resp = httpx.post(served[0].url + "/v1/chat/completions", headers=headers,
                      json={"model": "tiny", "messages": [{"role": "user", "content": "w5 " * 600}],
                            "truncate_prompt_tokens": 20, **params})
    assert resp.status_code == 200 and resp.json()["usage"]["prompt_tokens"] == 20, resp.text


def test_the_room_for_max_tokens_and_the_texts_bound_count_the_kept_prompt(served):
    """A max_tokens that fits only beside the kept tokens is taken, and a text far past the context
    (refused before tokenising without truncation) is cut, over both endpoints."""
    context = served[1].router.config.max_model_len
    headers, n = {"Authorization": f"Bearer {KEY}"}, context * 3 // 4
    for path, prompt in (("/v1/completions", {"prompt": [5] * n}),
                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5 " * n}]})):
        body = {"model": "tiny", "max_tokens": context // 2, "temperature": 0, "ignore_eos": True, **prompt}
        assert httpx.post(served[0].url + path, headers=headers, json=body).status_code == 400
        resp = httpx.post(served[0].url + path, headers=headers, json={**body, "truncate_prompt_tokens": 8})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == context // 2, resp.text
    huge = "w5 " * context * 20
    body = {"model": "tiny", "prompt": huge, "max_tokens": 2}
    assert httpx.post(served[0].url + "/v1/completions", headers=headers, json=body).json()["error"]["param"] == "prompt"
    resp = httpx.post(served[0].url + "/v1/completions", headers=headers, json={**body, "truncate_prompt_tokens": 8})
    assert resp.status_code == 200 and resp.json()["usage"]["prompt_tokens"] == 8, resp.text


def test_a_requests_id_names_its_response(served):
    """vLLM's request_id: the response's id is built from it (chatcmpl-ID, cmpl-ID)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    chat = httpx.post(served[0].url + "/v1/chat/completions", headers=headers,
                      json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "request_id": "abc-1"})
    completion = httpx.post(served[0].url + "/v1/completions", headers=headers,
                            json={"model": "tiny", "prompt": "w5", "max_tokens": 2, "request_id": "abc-2"})
    assert chat.json()["id"] == "chatcmpl-abc-1" and completion.json()["id"] == "cmpl-abc-2"


def test_a_bad_word_that_is_no_text_is_refused_by_name(served):
    """JSON's \\ud800 escape: the tokenizer raised on the lone surrogate, a 500 and a traceback a request."""
    body = b'{"model": "tiny", "max_tokens": 2, "prompt": "w5", "bad_words": ["w5", "\\ud800"]}'
    resp = httpx.post(served[0].url + "/v1/completions", content=body,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "bad_words[1]", resp.text


def test_logprobs_are_rendered_off_the_event_loop(served, monkeypatch):
    """A long prompt's logprobs are a decode per position and top-n entry: on the event loop they held
    every other stream (minutes for 256 prompts of 8k tokens with echo)."""
    import threading

    from specray.cluster.serve import openai_chunks, openai_completions

    threads = []
    for module, name in ((openai_chunks, "chat_logprobs"), (openai_completions, "completion_logprobs")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, **k: threads.append(
            threading.current_thread().name) or real(*a, **k))
    headers = {"Authorization": f"Bearer {KEY}"}
    chat = httpx.post(served[0].url + "/v1/chat/completions", headers=headers, json={
        "model": "tiny", "messages": MESSAGES, "max_tokens": 2, "logprobs": True, "top_logprobs": 2})
    completion = httpx.post(served[0].url + "/v1/completions", headers=headers,
                            json={"model": "tiny", "prompt": "w5 w6", "max_tokens": 2, "logprobs": 2})
    assert chat.status_code == completion.status_code == 200
    assert len(threads) == 2 and all(t.startswith("specray-render") for t in threads), threads
    echoed, real_echo = [], openai_completions.echo_logprobs  # a stream's echo chunk: every prompt position
    monkeypatch.setattr(openai_completions, "echo_logprobs", lambda *a: echoed.append(
        threading.current_thread().name) or real_echo(*a))
    streamed = httpx.post(served[0].url + "/v1/completions", headers=headers, json={
        "model": "tiny", "prompt": "w5 w6 w7", "max_tokens": 2, "logprobs": 1, "echo": True, "stream": True})
    assert streamed.status_code == 200 and echoed and all(t.startswith("specray-render") for t in echoed), echoed
