"""Hostile and careless clients, bad inputs: over HTTP and gRPC every bad input gets its status and
a clear error body while a concurrent good request completes unchanged; a request that breaks a
worker fails alone; extreme sampling values behave; slow or huge request heads are cut off."""

import threading
import time

import grpc
import httpx
import pytest

from specray.client import Client, InvalidArgumentError, NotFoundError, ResourceExhaustedError
from specray.client.errors import SpecrayError
from specray.protos.specray.v1 import generate_pb2 as pb

from hostile_helpers import GOOD, LEAKS, LIMIT, POISON, GoodStream, post

CHAT = [{"role": "user", "content": "w10 w11"}]
# (path, body or raw bytes, status, the error's param or a word of its message)
HTTP_CASES = [
    ("/v1/completions", {"prompt": "w5", "logprobs": 10**6}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 10**6}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("/v1/completions", {"prompt": ["w5"] * 300}, 400, "300 prompts x n=1: 300 sequences"),
    ("/v1/completions", {"prompt": "w5", "seed": 2**64}, 400, "seed"),
    ("/v1/completions", {"prompt": "w5", "seed": -2**63 - 1}, 400, "seed"),
    ("/v1/completions", {"prompt": "w5", "top_k": 2**31}, 400, "top_k"),
    ("/v1/completions", {"prompt": "w5", "stop_token_ids": list(range(65))}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "w5", "n": 1000}, 400, "n=1000"),
    ("/v1/completions", {"prompt": "w5", "n": 0}, 400, "n must"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": 10**6}, 400, "max_tokens"),  # more than the context holds
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 10**6}, 400, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "w5", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "w5", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", b'{"prompt": "w5", "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "w5", "top_p": Infinity}', 400, "top_p"),
    ("/v1/completions", {"prompt": "w5", "echo": "yes"}, 400, "echo"),
    ("/v1/completions", {"prompt": "w5", "suffix": "w6"}, 400, "suffix"),
    ("/v1/chat/completions", {"messages": CHAT, "echo": "yes"}, 400, "echo"),
    ("/v1/completions", {"prompt": "w5", "prompt_logprobs": 2, "stream": True}, 400, "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "w5", "presence_penalty": False}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "w5", "logit_bias": {"5": 500}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "w5", "logit_bias": {" 5": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "w5", "logit_bias": {"5_0": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "w5", "best_of": 3}, 400, "best_of"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/completions", {"prompt": "w5", "frequency_penalty": 5.0}, 400, "frequency_penalty"),
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', 400, "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\udc00"}]}', 400, "messages[0].content"),
    ("/v1/completions", {"prompt": "w5", "stop": ["\ud800"]}, 400, "stop[0]"),
    ("/v1/completions", {"prompt": "w5", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "w5", "stop_token_ids": [10**6]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": [10**9]}, 400, "token ids"),
    ("/v1/completions", {"prompt": [5] * 600}, 400, "context"),
    ("/v1/completions", {"prompt": "w5 " * 2000}, 400, "context"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": "w5", "model": "other"}, 404, "model"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text"),
    ("/v1/completions", b'{"prompt": ', 400, "JSON"),
    ("/v1/completions", b'\xff\xfe\x00', 400, "JSON"),
    ("/v1/completions", b'[' * 20000 + b']' * 20000, 400, ""),
    ("/v1/completions", b'{"prompt": "' + b'w5 ' * (LIMIT // 3) + b'"}', 413, "larger than"),
    ("/v1/nowhere", {}, 404, "Not Found"),
]


def test_bad_http_requests_fail_alone_with_openai_errors(engine, reference):
    good = GoodStream(engine.http.url)
    before = engine.metrics()
    answers = [(case, post(engine.http.url, case[0], case[1])) for case in HTTP_CASES]
    answers.append((("/v1/models", "POST", 405, "Method"), httpx.post(engine.http.url + "/v1/models")))
    wrong = []
    for (path, _, status, word), resp in answers:
        error = resp.json().get("error") if resp.headers.get("content-type") == "application/json" else None
        ok = (resp.status_code == status and error is not None and error["message"] and error["type"]
              and (word in error["message"] or word == error["param"])
              and not any(leak in error["message"] for leak in LEAKS))
        if not ok:
            wrong.append((path, status, word, resp.status_code, resp.text[:200]))
    assert not wrong
    assert good.text() == reference.outputs[0].text  # the good request never noticed
    after = engine.metrics()
    failures = sum(after[k] - before.get(k, 0) for k in after if k.startswith("specray_request_failure_total"))
    assert failures == len(answers)  # every error counted once, 404/405/413 included
    assert engine.idle()


def test_a_request_that_breaks_a_worker_fails_alone(engine, reference):
    good = GoodStream(engine.http.url)
    with Client(engine.grpc.target, timeout=60) as c:
        grpc_good = threading.Thread(target=lambda: setattr(
            good, "grpc", [t for d in c.stream(GOOD, max_tokens=150, temperature=0, ignore_eos=True)
                           for t in d.token_ids]))
        grpc_good.start()
        before = engine.metrics()
        http_bad = post(engine.http.url, "/v1/completions", {"prompt": [5, POISON, 7], "max_tokens": 8})
        sse_bad = post(engine.http.url, "/v1/completions", {"prompt": [POISON], "max_tokens": 8, "stream": True})
        with pytest.raises(SpecrayError) as grpc_bad:
            c.generate([POISON, 5], max_tokens=8)
        grpc_good.join(120)
    for message in (http_bad.json()["error"]["message"], sse_bad.json()["error"]["message"], grpc_bad.value.details):
        assert "reference" in message and not any(leak in message for leak in LEAKS)
    assert http_bad.status_code == 500 and sse_bad.status_code == 500
    assert grpc_bad.value.code == grpc.StatusCode.INTERNAL
    assert good.text() == reference.outputs[0].text and good.grpc == reference.outputs[0].token_ids
    assert engine.metrics()['specray_request_failure_total{status="500"}'] == \
        before.get('specray_request_failure_total{status="500"}', 0) + 3
    assert engine.idle()


def test_bad_grpc_requests_are_invalid_argument_and_fail_alone(engine, reference):
    good = GoodStream(engine.http.url)
    cases = [
        (dict(top_k=2**31), InvalidArgumentError, "top_k"), (dict(logprobs=10**6), InvalidArgumentError, "logprobs"),
        (dict(n=1000), InvalidArgumentError, "n=1000"), (dict(temperature=-1.0), InvalidArgumentError, "temperature"),
        (dict(stop_token_ids=[10**6]), InvalidArgumentError, "stop_token_ids"),
        (dict(model="other"), NotFoundError, "other"),
    ]
    with Client(engine.grpc.target, timeout=60) as c:
        for kwargs, error, word in cases:
            with pytest.raises(error, match=word):
                c.generate(GOOD, max_tokens=4, **kwargs)
        for prompt, word in (([10**9], "token ids"), ("a" * (LIMIT // 2), "context")):
            with pytest.raises(InvalidArgumentError, match=word):
                c.generate(prompt, max_tokens=4)
        with pytest.raises(InvalidArgumentError, match="role"):
            c.chat([{"role": "wizard", "content": "hi"}], max_tokens=4)
        with pytest.raises(InvalidArgumentError, match="max_tokens"):  # more than the context holds
            c.generate(GOOD, max_tokens=10**6)
        with pytest.raises(ResourceExhaustedError):  # over the message limit
            c.generate("w5 " * LIMIT, max_tokens=4)
    with grpc.insecure_channel(engine.grpc.target) as channel:  # bytes that are no GenerateRequest
        raw = channel.unary_unary("/specray.v1.Generation/Complete", request_serializer=None,
                                  response_deserializer=pb.CompleteResponse.FromString)
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff", timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "GenerateRequest" in err.value.details()
    with pytest.raises(ValueError, match=r"messages\[0\]"):  # the SDK checks before sending
        Client(engine.grpc.target).chat([{"content": "no role"}])
    assert good.text() == reference.outputs[0].text
    assert engine.idle()


@pytest.mark.parametrize("extreme", [dict(temperature=1e-38), dict(temperature=5e-324), dict(top_p=1e-38),
                                     dict(top_p=1e-50)])
def test_extreme_temperature_and_top_p_behave_like_greedy(engine, reference, extreme):
    body = {"prompt": GOOD, "max_tokens": 40, "ignore_eos": True, "seed": 3, **extreme}
    resp = post(engine.http.url, "/v1/completions", body)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == \
        post(engine.http.url, "/v1/completions", {**body, "temperature": 0}).json()["choices"][0]["text"]


def test_huge_temperature_samples_without_nan(engine):
    resp = post(engine.http.url, "/v1/completions", {"prompt": GOOD, "max_tokens": 20, "temperature": 1e30,
                                                      "ignore_eos": True, "seed": 1})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 20

def test_slow_or_huge_request_heads_are_cut_off(engine, reference):
    """The replica's HTTP server closes a connection whose request head is not whole within the
    deadline (slowloris), and refuses heads over 64 KiB; a good request meanwhile is unaffected."""
    import socket

    good = GoodStream(engine.http.url)
    host, port = engine.http.host, engine.http.port
    with socket.create_connection((host, port)) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        slow.settimeout(5)
        start = time.monotonic()
        assert slow.recv(1024) == b"" and time.monotonic() - start < 3  # closed after ~1 s
    with socket.create_connection((host, port)) as huge:
        huge.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        huge.settimeout(5)
        answer = huge.recv(1024)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431")  # split head: h11 cuts it; whole: 431
    assert good.text() == reference.outputs[0].text
