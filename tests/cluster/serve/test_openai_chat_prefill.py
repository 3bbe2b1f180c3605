"""vLLM's chat template options on /v1/chat/completions: `continue_final_message` (a prefilled reply
the model continues), `add_generation_prompt`, and chat `echo` (the reply starts with the last
message when that has the reply's role), streamed and not, against the offline API."""

import json

import httpx
import pytest

from specray import SamplingParams
from specray.kernels.chat import chat_token_ids

from openai_helpers import KEY, MESSAGES, offline, served  # noqa: F401 - fixtures

GREEDY = dict(temperature=0, max_tokens=6, ignore_eos=True)
PREFILL = [*MESSAGES, {"role": "assistant", "content": "w30 w31"}]
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}


def post(served, body, status=200):
    r = httpx.post(served[0].url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                   json={"model": "tiny", **GREEDY, **body})
    assert r.status_code == status, r.text
    return r.json()


def stream(served, body):
    with httpx.stream("POST", served[0].url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60, json={"model": "tiny", **GREEDY, "stream": True, **body}) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


@pytest.fixture(scope="module")
def want(offline):
    return offline.chat(PREFILL, SamplingParams(**GREEDY), **CONTINUE)[0]


def test_the_offline_prompt_ends_inside_the_message_it_continues(offline, want):
    tok = offline.get_tokenizer()
    opened = chat_token_ids(tok, PREFILL)
    assert tok.decode(want.prompt_token_ids).endswith("w30 w31") and want.prompt_token_ids != opened
    assert want.prompt_token_ids == chat_token_ids(tok, PREFILL, **CONTINUE)
    with pytest.raises(ValueError, match="set add_generation_prompt to false"):
        offline.chat(PREFILL, SamplingParams(**GREEDY), continue_final_message=True)


def test_continue_final_message_answers_what_the_offline_api_does(served, want):
    body = post(served, {"messages": PREFILL, **CONTINUE})
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": want.outputs[0].text}
    assert body["usage"]["prompt_tokens"] == len(want.prompt_token_ids)
    chunks = [c["choices"][0] for c in stream(served, {"messages": PREFILL, **CONTINUE})]
    assert chunks[0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["delta"].get("content", "") for c in chunks) == want.outputs[0].text


def test_echo_starts_the_reply_with_the_message_it_continues(served, want):
    body = {"messages": PREFILL, **CONTINUE, "echo": True, "logprobs": True}
    choice = post(served, body)["choices"][0]
    assert choice["message"]["content"] == "w30 w31" + want.outputs[0].text
    assert len(choice["logprobs"]["content"]) == len(want.outputs[0].token_ids)  # the generated tokens' only
    chunks = [c["choices"][0] for c in stream(served, body)]
    assert chunks[1]["delta"] == {"content": "w30 w31"} and chunks[1]["logprobs"] is None
    assert "".join(c["delta"].get("content", "") for c in chunks) == choice["message"]["content"]


def test_echo_of_another_role_adds_nothing_and_a_closed_turn_takes_its_role(served, offline):
    opened = offline.chat(MESSAGES, SamplingParams(**GREEDY))[0].outputs[0].text
    assert post(served, {"messages": MESSAGES, "echo": True})["choices"][0]["message"] == {
        "role": "assistant", "content": opened}  # the last message is the user's: a new assistant turn
    closed = post(served, {"messages": MESSAGES, "add_generation_prompt": False, "echo": True})["choices"][0]
    assert closed["message"]["role"] == "user" and closed["message"]["content"].startswith(MESSAGES[-1]["content"])


@pytest.mark.parametrize("body, param", [({"continue_final_message": True}, "continue_final_message"),
                                         ({"echo": "yes"}, "echo"), ({"add_generation_prompt": 1}, None)])
def test_contradictory_or_mistyped_options_are_400(served, body, param):
    error = post(served, {"messages": PREFILL, **body}, status=400)["error"]
    assert param is None or error["param"] == param


NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('this model takes no "
             "system message') }}{% endif %}{{ m['content'] }} {% endfor %}")


def test_a_chat_template_that_refuses_the_conversation_is_a_400(served, offline):
    """A template's own refusal (jinja2's raise_exception: Mistral's alternating roles, Gemma's system
    role) is the request's fault, as vLLM answers it, not the server's: a 400 naming `messages`, and
    a ValueError from the offline API."""
    tok = served[1].router.tokenizer
    kept, tok.chat_template = tok.chat_template, NO_SYSTEM
    try:
        messages = [{"role": "system", "content": "w1"}, *MESSAGES]
        err = post(served, {"messages": messages}, status=400)["error"]
        assert err["param"] == "messages" and "this model takes no system message" in err["message"], err
        assert post(served, {"messages": MESSAGES})["choices"][0]["message"]["content"]
        with pytest.raises(ValueError, match="refused the conversation: this model takes no system message"):
            chat_token_ids(tok, messages)
    finally:
        tok.chat_template = kept
