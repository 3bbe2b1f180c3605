"""The completions API's `echo` (the prompt before the completion, with its logprobs) and vLLM's
`prompt_logprobs` on both endpoints, against the offline engine's prompt logprobs."""

import json

import httpx
import pytest

from specray import SamplingParams

from openai_helpers import KEY, MESSAGES, client, offline, served  # noqa: F401 - fixtures

PROMPT = "w20 w21 w22 w23 w21 w22"
GREEDY = dict(temperature=0, max_tokens=5, ignore_eos=True)


def post(served, path, body):
    r = httpx.post(served[0].url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                   json={"model": "tiny", **GREEDY, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream(served, body):
    with httpx.stream("POST", served[0].url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60, json={"model": "tiny", **GREEDY, "stream": True, **body}) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


@pytest.fixture(scope="module")
def want(offline):
    return offline.generate(PROMPT, SamplingParams(**GREEDY, prompt_logprobs=2, logprobs=2))[0]


def test_echo_puts_the_prompt_and_its_logprobs_first(served, want):
    choice = post(served, "/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 2})["choices"][0]
    assert choice["text"] == PROMPT + want.outputs[0].text
    lp, ids = choice["logprobs"], want.prompt_token_ids + want.outputs[0].token_ids
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    every = want.prompt_logprobs[1:] + want.outputs[0].logprobs
    assert lp["token_logprobs"][1:] == pytest.approx([e[t].logprob for e, t in zip(every, ids[1:])], abs=1e-6)
    assert all(2 <= len(top) <= 3 for top in lp["top_logprobs"][1:])
    assert all(choice["text"][o:o + len(t)] == t for o, t in zip(lp["text_offset"], lp["tokens"]))
    plain = post(served, "/v1/completions", {"prompt": PROMPT, "echo": True})["choices"][0]
    assert plain["text"] == choice["text"] and plain["logprobs"] is None


def test_a_streamed_echo_is_the_unstreamed_one(served):
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1}
    whole = post(served, "/v1/completions", body)["choices"][0]
    chunks = [c["choices"][0] for c in stream(served, body)]
    assert chunks[0]["text"] == PROMPT and chunks[0]["finish_reason"] is None
    assert "".join(c["text"] for c in chunks) == whole["text"]
    for key in ("tokens", "token_logprobs", "text_offset"):
        assert sum((c["logprobs"][key] for c in chunks), []) == whole["logprobs"][key]


def test_echo_of_token_ids_decodes_them(served, offline):
    ids = offline.get_tokenizer()(PROMPT).input_ids
    choice = post(served, "/v1/completions", {"prompt": ids, "echo": True})["choices"][0]
    assert choice["text"].startswith(offline.get_tokenizer().decode(ids))


def test_vllm_prompt_logprobs_on_both_endpoints(served, offline, want):
    choice = post(served, "/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 2})["choices"][0]
    assert choice["text"] == want.outputs[0].text and choice["prompt_logprobs"][0] is None
    for got, entry in zip(choice["prompt_logprobs"][1:], want.prompt_logprobs[1:]):
        assert {int(t): (v["logprob"], v["rank"], v["decoded_token"]) for t, v in got.items()} == \
            {t: (pytest.approx(v.logprob, abs=1e-6), v.rank, v.decoded_token) for t, v in entry.items()}
    chat = post(served, "/v1/chat/completions", {"messages": MESSAGES, "prompt_logprobs": 0})
    ids = offline.apply_chat_template(MESSAGES)
    assert len(chat["prompt_logprobs"]) == len(ids) and chat["prompt_logprobs"][0] is None
    assert [list(map(int, e)) for e in chat["prompt_logprobs"][1:]] == [[t] for t in ids[1:]]


@pytest.mark.parametrize("streamed", [False, True])
def test_echo_with_max_tokens_zero_scores_the_prompt_alone(served, want, streamed):
    """The legacy API's way to score a prompt (and vLLM's): its text and logprobs, nothing generated."""
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0}
    if streamed:
        chunks = stream(served, {**body, "stream_options": {"include_usage": True}})
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        text = "".join(c["text"] for c in choices)
        tokens = sum((c["logprobs"]["token_logprobs"] for c in choices), [])
        reason, usage = choices[-1]["finish_reason"], chunks[-1]["usage"]
    else:
        resp = post(served, "/v1/completions", body)
        choice, usage = resp["choices"][0], resp["usage"]
        text, tokens, reason = choice["text"], choice["logprobs"]["token_logprobs"], choice["finish_reason"]
    ids = want.prompt_token_ids
    assert text == PROMPT and reason == "length" and usage["completion_tokens"] == 0
    assert tokens[0] is None and tokens[1:] == pytest.approx(
        [e[t].logprob for e, t in zip(want.prompt_logprobs[1:], ids[1:])], abs=1e-6)
