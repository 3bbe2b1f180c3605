"""The OpenAI-compatible HTTP API over a real engine, driven by the official `openai` client."""

import time

import httpx
import openai
import pytest

from specray import LLM, SamplingParams
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer

KEY = "sk-test"
MESSAGES = [{"role": "user", "content": "w10 w11 w12"}]


@pytest.fixture(scope="module")
def offline(tiny_target):
    return LLM(str(tiny_target))


@pytest.fixture(scope="module")
def served(tiny_target, tiny_draft):
    llm = LLM(str(tiny_target), speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3})
    router = AsyncRouter(llm.router)
    server = OpenAIServer(router, llm.get_tokenizer(), "tiny", api_key=KEY)
    with BackgroundServer(server.app) as http:
        yield http, router
    router.shutdown()


@pytest.fixture()
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key=KEY, max_retries=0)


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
    (dict(frequency_penalty=0.5), 400), (dict(model="other"), 404), (dict(messages=[]), 400),
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


@pytest.mark.parametrize("field, value", [("max_tokens", -3), ("temperature", -1), ("top_p", 2.0), ("n", 0),
                                          ("stop", [""]), ("seed", -1)])
def test_a_refused_sampling_parameter_is_named_in_param(field, value):
    """OpenAI's error body names the offending field in `param`, as for the schema's own errors."""
    from specray.cluster.serve.openai_protocol import ApiError, ChatRequest

    body = ChatRequest(messages=[{"role": "user", "content": "hi"}], **{field: value})
    with pytest.raises(ApiError) as e:
        body.sampling_params(16, None)
    assert e.value.status == 400 and e.value.param == field and field in str(e.value)
