"""Hostile and careless clients against the HTTP and gRPC APIs sharing one engine: every bad input
gets its status and a clear error body while a concurrent good request completes unchanged; a
request that breaks a worker fails alone; disconnects free sequences; overload is bounded."""

import asyncio
import json
import threading
import time

import grpc
import httpx
import pytest

from specray import LLM, SamplingParams
from specray.client import AsyncClient, Client, InvalidArgumentError, NotFoundError, ResourceExhaustedError
from specray.client.errors import SpecrayError
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_service import GenerationService
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer
from specray.protos.specray.v1 import generate_pb2 as pb

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
GOOD = [5, 9, 14, 5, 9, 14, 5]  # token ids: a prompt the n-gram draft speculates on
POISON = 96  # a prompt holding this token id makes the (wrapped) target worker raise
LIMIT = 64 * 1024  # body and message size limit of these servers
LEAKS = ("ray::", "pid=", "actor", "Traceback", "0xdead", "\x1b[")


class Engine:
    """One engine behind HTTP and gRPC, with a step that sleeps (so long requests stay running)
    and a target worker that fails any step holding a POISON prompt."""

    def __init__(self, tiny_target, max_num_seqs=32, max_waiting=256):
        self.llm = LLM(str(tiny_target), speculative_config=NGRAM, max_num_seqs=max_num_seqs)
        router, target = self.llm.router, self.llm.target
        step, worker_step = router.step, target.step
        self.delay = 0.003  # seconds a round at least
        router.step = lambda: (time.sleep(self.delay), step())[1]

        def poisoned(items):
            if any(item.spec is not None and POISON in item.new_token_ids for item in items):  # prefills
                raise RuntimeError("boom in actor 0xdeadbeef pid=4242 \x1b[31mTraceback\x1b[0m")
            return worker_step(items)
        target.step = poisoned
        self.router = AsyncRouter(router, max_waiting)
        self.http_server = OpenAIServer(self.router, self.llm.get_tokenizer(), "tiny", max_request_bytes=LIMIT)
        self.grpc_service = GenerationService(self.router, self.llm.get_tokenizer(), "tiny",
                                              metrics=self.http_server.metrics)

    def __enter__(self):
        self.http = BackgroundServer(self.http_server.app, header_timeout_s=1.0).__enter__()
        self.grpc = GrpcServerThread(self.grpc_service, max_message_bytes=LIMIT).__enter__()
        return self

    def __exit__(self, *exc):
        self.grpc.__exit__(*exc)
        self.http.__exit__(*exc)
        self.router.shutdown()

    def idle(self, seconds: float = 10) -> bool:
        r = self.router.router
        end = time.monotonic() + seconds
        while (r.has_unfinished() or r.reserved_tokens) and time.monotonic() < end:
            time.sleep(0.02)
        return not r.has_unfinished() and r.reserved_tokens == 0

    def metrics(self) -> dict[str, float]:
        lines = httpx.get(self.http.url + "/metrics").text.splitlines()
        return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if ln and not ln.startswith("#")}


@pytest.fixture(scope="module")
def engine(tiny_target):
    with Engine(tiny_target) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_target):
    llm = LLM(str(tiny_target))
    return llm.generate({"prompt_token_ids": GOOD}, SamplingParams(temperature=0, max_tokens=150, ignore_eos=True))[0]


class GoodStream:
    """A greedy SSE completion running in a thread while the bad requests arrive."""

    def __init__(self, url: str, max_tokens: int = 150):
        self.url, self.max_tokens, self.events = url, max_tokens, []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.started.wait(30)

    def _run(self):
        body = {"prompt": GOOD, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    self.started.set()

    def text(self) -> str:
        self.thread.join(120)
        assert self.events[-1] == "[DONE]", self.events[-3:]
        chunks = [json.loads(e) for e in self.events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        return "".join(c["choices"][0]["text"] for c in chunks)


CHAT = [{"role": "user", "content": "w10 w11"}]
# (path, body or raw bytes, status, the error's param or a word of its message)
HTTP_CASES = [
    ("/v1/completions", {"prompt": "w5", "logprobs": 10**6}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 10**6}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "w5", "seed": 2**63}, 400, "seed"),
    ("/v1/completions", {"prompt": "w5", "seed": -1}, 400, "seed"),
    ("/v1/completions", {"prompt": "w5", "seed": 2**63 - 1, "n": 2}, 400, "seed"),  # choice 1 draws with seed + 1
    ("/v1/completions", {"prompt": "w5", "top_k": 2**31}, 400, "top_k"),
    ("/v1/completions", {"prompt": "w5", "stop_token_ids": list(range(65))}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "w5", "n": 1000}, 400, "n=1000"),
    ("/v1/completions", {"prompt": "w5", "n": 0}, 400, "n must"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "w5", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "w5", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", b'{"prompt": "w5", "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "w5", "top_p": Infinity}', 400, "top_p"),
    ("/v1/completions", {"prompt": "w5", "echo": True}, 400, "echo"),
    ("/v1/completions", {"prompt": "w5", "logit_bias": {"5": 10}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "w5", "best_of": 3}, 400, "best_of"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/completions", {"prompt": "w5", "frequency_penalty": 0.5}, 400, "frequency_penalty"),
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


def _post(url: str, path: str, body) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60)


def test_bad_http_requests_fail_alone_with_openai_errors(engine, reference):
    good = GoodStream(engine.http.url)
    before = engine.metrics()
    answers = [(case, _post(engine.http.url, case[0], case[1])) for case in HTTP_CASES]
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
        http_bad = _post(engine.http.url, "/v1/completions", {"prompt": [5, POISON, 7], "max_tokens": 8})
        sse_bad = _post(engine.http.url, "/v1/completions", {"prompt": [POISON], "max_tokens": 8, "stream": True})
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
        (dict(seed=2**63), InvalidArgumentError, "seed"), (dict(logprobs=10**6), InvalidArgumentError, "logprobs"),
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


@pytest.mark.parametrize("extreme", [dict(temperature=1e-38), dict(temperature=5e-324), dict(top_p=1e-38)])
def test_extreme_temperature_and_top_p_behave_like_greedy(engine, reference, extreme):
    body = {"prompt": GOOD, "max_tokens": 40, "ignore_eos": True, "seed": 3, **extreme}
    resp = _post(engine.http.url, "/v1/completions", body)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == \
        _post(engine.http.url, "/v1/completions", {**body, "temperature": 0}).json()["choices"][0]["text"]


def test_huge_temperature_samples_without_nan(engine):
    resp = _post(engine.http.url, "/v1/completions", {"prompt": GOOD, "max_tokens": 20, "temperature": 1e30,
                                                      "ignore_eos": True, "seed": 1})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 20


def test_every_disconnect_frees_its_sequences(engine):
    long = {"prompt": GOOD, "max_tokens": 400, "ignore_eos": True, "temperature": 0}
    engine.delay = 0.03  # a long request now takes seconds
    r = engine.router.router
    aborted = []
    abort = r.abort
    r.abort = lambda request_id: (aborted.append(request_id), abort(request_id))
    try:
        with pytest.raises(httpx.ReadTimeout):  # HTTP unary: the client gives up
            _post_timeout(engine.http.url, long, 0.5)
        assert engine.idle() and len(aborted) == 1
        with httpx.stream("POST", engine.http.url + "/v1/completions", json={**long, "stream": True}) as resp:
            next(resp.iter_lines())  # SSE: hang up after the first event
        assert engine.idle() and len(aborted) == 2
        with Client(engine.grpc.target, timeout=0.5) as c:  # gRPC unary and stream: deadline
            with pytest.raises(SpecrayError):
                c.generate(GOOD, max_tokens=400, ignore_eos=True, temperature=0)
            assert engine.idle() and len(aborted) == 3
        with Client(engine.grpc.target, timeout=30) as c:
            stream = c.stream(GOOD, max_tokens=400, ignore_eos=True, temperature=0)
            next(iter(stream))
            stream.cancel()  # SDK sync stream: cancelled
        assert engine.idle() and len(aborted) == 4

        async def async_cancel():
            async with AsyncClient(engine.grpc.target, timeout=30) as c:
                task = asyncio.ensure_future(c.generate(GOOD, max_tokens=400, ignore_eos=True, temperature=0))
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        asyncio.run(async_cancel())  # SDK async unary: cancelled
        assert engine.idle() and len(aborted) == 5

        async def async_stream_cancel():
            async with AsyncClient(engine.grpc.target, timeout=30) as c:
                async with c.stream(GOOD, max_tokens=400, ignore_eos=True, temperature=0) as stream:
                    async for _ in stream:
                        break  # leaving the block cancels the call
        asyncio.run(async_stream_cancel())  # SDK async stream: cancelled
        assert engine.idle() and len(aborted) == 6
    finally:
        r.abort, engine.delay = abort, 0.003


def _post_timeout(url: str, body: dict, seconds: float):
    return httpx.post(url + "/v1/completions", json=body, timeout=seconds)


def test_overload_is_bounded_and_every_accepted_request_completes(tiny_target):
    max_waiting = 4
    with Engine(tiny_target, max_num_seqs=2, max_waiting=max_waiting) as engine:
        engine.delay = 0.05  # slow rounds while the queue is full, so it stays full
        long = {"prompt": GOOD, "max_tokens": 60, "ignore_eos": True, "temperature": 0, "num_speculative_tokens": 0}
        # 1. a full queue, deterministically: 2 running + 4 waiting sequences; both APIs refuse more
        fill = [None] * 4
        threads = [threading.Thread(target=lambda i=i: fill.__setitem__(i, _post(
            engine.http.url, "/v1/completions", {**long, "n": 2 if i < 2 else 1}))) for i in range(4)]

        def wait_for(gauge: str, value: float):
            end = time.monotonic() + 30
            while engine.metrics().get(gauge, 0) < value and time.monotonic() < end:
                time.sleep(0.01)
        threads[0].start()
        wait_for("specray_num_requests_running", 2)
        for t in threads[1:]:
            t.start()
        wait_for("specray_num_requests_waiting", max_waiting)
        refused = _post(engine.http.url, "/v1/completions", long)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        with Client(engine.grpc.target, timeout=60) as c, pytest.raises(ResourceExhaustedError, match="waiting"):
            c.generate(GOOD, max_tokens=4)
        engine.delay = 0.003
        for t in threads:
            t.join(120)
        assert [r.status_code for r in fill] == [200] * 4  # every accepted request completes

        # 2. a random burst: answered 200 or 429, never more waiting than the bound
        peak, stop = [0.0], threading.Event()

        def watch():
            while not stop.wait(0.01):
                peak[0] = max(peak[0], engine.metrics().get("specray_num_requests_waiting", 0))

        watcher = threading.Thread(target=watch)
        watcher.start()
        results = [None] * 16
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, _post(
            engine.http.url, "/v1/completions", {**long, "max_tokens": 30, "n": 1 + i % 2}))) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stop.set()
        watcher.join()
        codes = [r.status_code for r in results]
        assert set(codes) <= {200, 429} and 200 in codes
        for r in results:
            if r.status_code == 200:
                assert all(len(ch["text"].split()) == 30 for ch in r.json()["choices"])
        assert peak[0] <= max_waiting
        m = engine.metrics()
        answered = sum(v for k, v in m.items()
                       if k.startswith(("specray_request_success_total", "specray_request_failure_total")))
        assert answered == 4 + 2 + 16  # every request counted once, in success or failure
        assert engine.idle() and engine.metrics()["specray_num_requests_waiting"] == 0


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
