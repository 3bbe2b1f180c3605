"""The OpenAI-compatible HTTP API over a real engine, driven by the official `openai` client."""

import time

import httpx
import openai
import pytest

from specray import SamplingParams

from openai_helpers import KEY, MESSAGES, client, offline, served  # noqa: F401 - fixtures


def test_chat_matches_offline_greedy(client, offline):
    want = offline.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=12,
                                          extra_body={"ignore_eos": True})
    assert resp.choices[0].message.content == want.text and resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 12
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=12,
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_completions_stream_and_not(client, offline):
    want = offline.generate("w20 w21 w22", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    resp = client.completions.create(model="tiny", prompt="w20 w21 w22", temperature=0, max_tokens=10,
                                     extra_body={"ignore_eos": True})
    assert resp.choices[0].text == want.outputs[0].text
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="w20 w21 w22", temperature=0, max_tokens=10, stream=True,
        extra_body={"ignore_eos": True}))
    assert text == want.outputs[0].text


@pytest.mark.parametrize("chat", [True, False])
def test_include_usage_puts_null_usage_on_every_chunk_before_the_usage_chunk(served, chat):
    """As OpenAI streams with stream_options.include_usage: `"usage": null` on each chunk, then one
    with no choices and the usage; without the option no chunk has the key."""
    import json

    path, body = (("/v1/chat/completions", {"messages": MESSAGES}) if chat else
                  ("/v1/completions", {"prompt": "w20 w21 w22"}))
    for include in (True, False):
        extra = {"stream_options": {"include_usage": True}} if include else {}
        with httpx.stream("POST", served[0].url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                          json={"model": "tiny", "max_tokens": 5, "stream": True, "ignore_eos": True, **body, **extra}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        if include:
            # a fast box may coalesce a completion's 5 tokens into one chunk (chat adds the role chunk)
            assert all("usage" in c and c["usage"] is None for c in chunks[:-1]) and len(chunks) >= 2 + chat
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
        else:
            assert not any("usage" in c for c in chunks)


def test_choices_carry_vllms_stop_reason(served, offline):
    """vLLM's `stop_reason`: the stop string or stop token id that ended a choice, else null."""
    import json

    text = offline.generate("w20 w21 w22", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    word, tok = text.outputs[0].text.split()[2], text.outputs[0].token_ids[4]
    url, auth = served[0].url, {"Authorization": f"Bearer {KEY}"}
    base = {"model": "tiny", "prompt": "w20 w21 w22", "temperature": 0, "max_tokens": 10, "ignore_eos": True}
    for extra, want in (({"stop": [word]}, word), ({"stop_token_ids": [tok]}, tok), ({}, None)):
        choice = httpx.post(url + "/v1/completions", json={**base, **extra}, headers=auth).json()["choices"][0]
        assert choice["stop_reason"] == want and choice["finish_reason"] == ("length" if want is None else "stop")
        with httpx.stream("POST", url + "/v1/completions", json={**base, **extra, "stream": True}, headers=auth) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["stop_reason"] == want
    chat = httpx.post(url + "/v1/chat/completions", headers=auth, json={
        "model": "tiny", "messages": MESSAGES, "max_tokens": 5, "ignore_eos": True}).json()["choices"][0]
    assert "stop_reason" in chat and chat["stop_reason"] is None


def test_n_seed_logprobs_and_models(client):
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, seed=5, max_tokens=6,
                                          logprobs=True, top_logprobs=2)
    again = client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, seed=5, max_tokens=6,
                                           logprobs=True, top_logprobs=2)
    assert [c.message.content for c in resp.choices] == [c.message.content for c in again.choices]
    assert len(resp.choices) == 2 and resp.choices[0].logprobs.content[0].logprob <= 0
    assert [m.id for m in client.models.list().data] == ["tiny"]


@pytest.mark.parametrize("kwargs, status", [
    (dict(temperature=-1), 400), (dict(top_p=2.0), 400), (dict(max_tokens=0), 400), (dict(n=0), 400),
    (dict(frequency_penalty=5.0), 400), (dict(model="other"), 404), (dict(messages=[]), 400),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client, kwargs, status):
    args = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**args)
    assert err.value.status_code == status and err.value.body["message"]
    assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices


def test_api_key_is_required(served):
    bad = openai.OpenAI(base_url=served[0].url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(served[0].url + "/health").json() == {"status": "ok"}
    assert httpx.head(served[0].url + "/health").status_code == 200  # load balancers probe with HEAD too
    models = served[0].url + "/v1/models"
    # the scheme's case is free (RFC 9110; it was a 401), the key's is not, nor is another scheme
    assert httpx.get(models, headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    assert httpx.get(models, headers={"Authorization": f"Bearer   {KEY}"}).status_code == 200
    assert httpx.get(models, headers={"Authorization": f"Bearer {KEY.upper()}"}).status_code == 401
    assert httpx.get(models, headers={"Authorization": f"Basic {KEY}"}).status_code == 401
    assert httpx.get(models, headers={"Authorization": KEY}).status_code == 401
    paths = httpx.get(served[0].url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()["paths"]
    assert paths["/metrics"]["get"]["summary"] == "Prometheus"  # was "<Lambda>"


def test_metrics_move(client, served):
    def scrape():
        lines = httpx.get(served[0].url + "/metrics").text.splitlines()
        return {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in lines if ln and not ln.startswith("#")}

    before = scrape()
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    after = scrape()
    assert after["specray_spec_decode_num_draft_tokens_total"] > before.get("specray_spec_decode_num_draft_tokens_total", 0)
    assert after['specray_request_success_total{finish_reason="length"}'] > \
        before.get('specray_request_success_total{finish_reason="length"}', 0)
    assert after["specray_time_to_first_token_seconds_count"] > before.get("specray_time_to_first_token_seconds_count", 0)
    assert "specray_num_requests_waiting" in after
    assert after["specray_draft_fallbacks_total"] == served[1].router.stats.draft_fallbacks == 0  # a lost draft shows here


def test_disconnect_frees_the_sequence(served):
    http, router = served
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", http.url + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content": "w' in line:
                break  # got some text; now hang up
    deadline = time.monotonic() + 10
    while router.router.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not router.router.has_unfinished() and router.router.reserved_tokens == 0


def _stop_across_tokens(offline, prompt: str) -> tuple[str, str]:
    """A stop string that spans two tokens of the greedy answer to `prompt`, and the text before it."""
    out = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    tok = offline.get_tokenizer()
    for k in range(1, len(out.token_ids) - 1):
        cut = len(tok.decode(out.token_ids[:k]))  # a token boundary inside the answer
        stop = out.text[cut - 2: cut + 2]
        if len(stop) == 4 and out.text.find(stop) == cut - 2:  # its first occurrence
            return stop, out.text[: cut - 2]
    raise AssertionError(f"no stop string fits {out.text!r}")


def test_a_stop_string_across_tokens_streams_the_text_it_answers(client, offline):
    """Streaming holds back a tail a stop string could begin with: the streamed text is the
    unstreamed one, never a piece of the stop string (which is cut once its last token comes)."""
    stop, want = _stop_across_tokens(offline, "w20 w21 w22")
    args = dict(model="tiny", prompt="w20 w21 w22", temperature=0, max_tokens=12, stop=stop,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0]
    streamed = list(client.completions.create(**args, stream=True))
    assert whole.text == want and whole.finish_reason == "stop"
    assert "".join(c.choices[0].text for c in streamed) == want
    assert [c.choices[0].finish_reason for c in streamed][-1] == "stop"
    chat = dict(model="tiny", messages=MESSAGES, temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
    text = client.chat.completions.create(**chat).choices[0].message.content
    stop = text[-6:-2]
    cut = client.chat.completions.create(**chat, stop=stop).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        **chat, stop=stop, stream=True) if c.choices)
    assert streamed == cut == text[: text.find(stop)]


def test_logprobs_list_the_n_most_likely_tokens_streamed_or_not(client):
    args = dict(model="tiny", messages=MESSAGES, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3)
    whole = client.chat.completions.create(**args).choices[0].logprobs.content
    for pos in whole:
        tops = [t.logprob for t in pos.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert pos.token == pos.top_logprobs[0].token and pos.logprob == tops[0]  # greedy: the drawn one leads
        assert pos.bytes == list(pos.token.encode()) and all(t.bytes == list(t.token.encode()) for t in pos.top_logprobs)
    streamed = [p for c in client.chat.completions.create(**args, stream=True)
                if c.choices and c.choices[0].logprobs for p in c.choices[0].logprobs.content]
    assert [(p.token, p.logprob, p.bytes) for p in streamed] == [(p.token, p.logprob, p.bytes) for p in whole]
    legacy = dict(model="tiny", prompt="w20 w21", temperature=0, max_tokens=4, logprobs=2)
    lp = client.completions.create(**legacy).choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert lp.text_offset[0] == 0 and all(lp.token_logprobs[i] in lp.top_logprobs[i].values() for i in range(4))
    text = client.completions.create(**legacy).choices[0].text
    assert "".join(lp.tokens) == text
    assert [text.index(t, o) for t, o in zip(lp.tokens, lp.text_offset)] == lp.text_offset
    chunks = [c.choices[0].logprobs for c in client.completions.create(**legacy, stream=True)]
    assert [t for c in chunks if c for t in c.tokens] == lp.tokens
    assert [o for c in chunks if c for o in c.text_offset] == lp.text_offset


def test_each_choice_streams_its_finish_once(client):
    chunks = [c for c in client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, seed=1, max_tokens=3,
                                                        stream=True) if c.choices]
    finishes = [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks if c.choices[0].finish_reason]
    assert sorted(finishes) == [(0, "length"), (1, "length")]


def test_vllm_output_options_are_applied(client, offline):
    stop, want = _stop_across_tokens(offline, "w20 w21 w22")
    args = dict(model="tiny", prompt="w20 w21 w22", temperature=0, max_tokens=12, stop=stop)
    kept = client.completions.create(**args, extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == want + stop


def test_a_body_that_is_not_an_object_and_the_model_card(served, client):
    resp = httpx.post(served[0].url + "/v1/chat/completions", content=b"hello", headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
    assert resp.status_code == 400 and "JSON object" in resp.json()["error"]["message"]
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.created > 0 and card.model_extra["max_model_len"] > 0
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_the_prompts_of_one_streamed_request_run_together(client, served, monkeypatch):
    prompts = ["w20 w21 w22", "w30 w31"]
    args = dict(model="tiny", prompt=prompts, temperature=0, max_tokens=12, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices
    router, batch = served[1].router, []
    step = router.step
    monkeypatch.setattr(router, "step", lambda: (batch.append(len(router.running)), step())[1])
    chunks = [c.choices[0] for c in client.completions.create(**args, stream=True)]
    for i in (0, 1):
        assert "".join(c.text for c in chunks if c.index == i) == whole[i].text
    # both prompts in one round (a fast box may coalesce each prompt's stream into one chunk, so the
    # chunks' order cannot tell: they used to stream one after the other)
    assert max(batch) == 2


def test_sampled_completions_logprobs_hold_the_drawn_token_beside_the_top_n(client):
    """OpenAI's legacy format: up to logprobs + 1 entries, the drawn token always among them."""
    lp = client.completions.create(model="tiny", prompt="w20 w21", temperature=5.0, seed=3, max_tokens=24,
                                   logprobs=1).choices[0].logprobs
    sizes = [len(top) for top in lp.top_logprobs]
    assert set(sizes) <= {1, 2} and 2 in sizes  # a token drawn below the top one somewhere
    assert all(tok in top and top[tok] == v for tok, top, v in zip(lp.tokens, lp.top_logprobs, lp.token_logprobs))


def test_a_server_error_after_the_headers_ends_the_stream_with_an_error_event(served, client, monkeypatch):
    """A bug while a streamed chunk is built (here: the logprobs') reaches the client as an error
    event and [DONE], as an API error there does, instead of a connection cut without either; the
    server keeps serving."""
    import json

    from specray.cluster.serve import openai_chunks

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in a chunk")

    monkeypatch.setattr(openai_chunks, "chat_logprobs", broken)
    with httpx.stream("POST", served[0].url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60, json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "stream": True,
                                        "logprobs": True}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert lines[-1] == "data: [DONE]" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["error"]["type"] == "internal_error" and "reference" in events[-1]["error"]["message"], events
    monkeypatch.undo()
    assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3).choices[0].message.content


def test_a_router_error_on_one_request_fails_only_that_request(served, client, monkeypatch):
    """An unexpected error while the router takes a request (not a refusal: a bug) is that request's
    500 with a reference, not the end of every turn: the server stays alive and keeps serving."""
    router = served[1].router
    add = router.add_request

    def picky(prompt_token_ids, *args, **kwargs):
        if len(prompt_token_ids) > 40:
            raise RuntimeError("a bug in admission")
        return add(prompt_token_ids, *args, **kwargs)

    monkeypatch.setattr(router, "add_request", picky)
    with pytest.raises(openai.InternalServerError, match="reference"):
        client.completions.create(model="tiny", prompt=" ".join(f"w{i}" for i in range(60)), max_tokens=3)
    assert served[1].alive and not router.has_unfinished()
    assert client.completions.create(model="tiny", prompt="w20 w21", max_tokens=3).choices[0].text
