"""Hostile and careless clients, connections and load: every disconnect frees its sequences (HTTP
unary and SSE, gRPC, the sync and async SDK), and overload is bounded: 429 / RESOURCE_EXHAUSTED with
Retry-After, every accepted request completes, the waiting queue never exceeds its bound."""

import asyncio
import threading
import time

import httpx
import pytest

from specray import LLM
from specray.client import AsyncClient, Client, ResourceExhaustedError
from specray.client.errors import SpecrayError
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.http_server import BackgroundServer
from specray.cluster.serve.openai_api import OpenAIServer

from hostile_helpers import GOOD, Engine, post

CHAT = [{"role": "user", "content": "w10 w11 w12"}]


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
                for _ in range(500):  # until the router runs it (a fixed 0.3 s was too short on a busy box)
                    await asyncio.sleep(0.02)
                    if r.has_unfinished():
                        break
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
        threads = [threading.Thread(target=lambda i=i: fill.__setitem__(i, post(
            engine.http.url, "/v1/completions", {**long, "n": 2 if i < 2 else 1}))) for i in range(4)]

        def wait_for(gauge: str, value: float):
            end = time.monotonic() + 30
            while engine.metrics().get(gauge, 0) < value and time.monotonic() < end:
                time.sleep(0.01)
        threads[0].start()
        wait_for("specray_num_requests_running", 2)
        assert 0 < engine.metrics()["specray_kv_cache_usage_perc"] <= 1  # two sequences hold their reservations
        for t in threads[1:]:
            t.start()
        wait_for("specray_num_requests_waiting", max_waiting)
        refused = post(engine.http.url, "/v1/completions", long)
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
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(
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
        assert peak[0] <= max_waiting + 2  # the bound, beyond the places the running batch had free
        m = engine.metrics()
        answered = sum(v for k, v in m.items()
                       if k.startswith(("specray_request_success_total", "specray_request_failure_total")))
        assert answered == 4 + 2 + 16  # every request counted once, in success or failure
        assert engine.idle() and engine.metrics()["specray_num_requests_waiting"] == 0
        assert engine.metrics()["specray_kv_cache_usage_perc"] == 0  # every reservation given back


def test_a_stream_whose_client_leaves_before_its_first_chunk_is_aborted(tiny_target):
    """One sequence slot, held by a long request: a second streamed request waits in the queue (no
    chunk yet, no response headers) and its client hangs up: it leaves the queue, it is never run."""
    llm = LLM(str(tiny_target), max_num_seqs=1)
    step = llm.router.target.submit_step
    llm.router.target.submit_step = lambda items: time.sleep(0.1) or step(items)  # a round takes 0.1 s
    router = AsyncRouter(llm.router)
    server = OpenAIServer(router, llm.get_tokenizer(), "tiny")
    body = {"model": "tiny", "messages": CHAT, "stream": True, "ignore_eos": True}
    with BackgroundServer(server.app) as http:
        held = []
        holder = threading.Thread(target=lambda: held.append(httpx.post(
            http.url + "/v1/chat/completions", timeout=60, json={**body, "stream": False, "max_tokens": 40})))
        holder.start()
        deadline = time.monotonic() + 10
        while not router.router.running and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(httpx.ReadTimeout):  # no headers while it waits: the client gives up
            httpx.post(http.url + "/v1/chat/completions", json={**body, "max_tokens": 5}, timeout=1.0)
        assert len(router.router.waiting) == 1 and len(router.router.running) == 1
        deadline = time.monotonic() + 2.0  # the polling notices within 0.5 s; the holder runs ~4 s
        while router.router.waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not router.router.waiting and len(router.router.running) == 1 and holder.is_alive()
        holder.join(timeout=30)
    router.shutdown()
    assert held[0].status_code == 200 and held[0].json()["usage"]["completion_tokens"] == 40


def test_calls_past_the_limit_get_503_while_idle_sockets_and_health_checks_do_not_count(tiny_target):
    """Two calls in flight at most: a third gets an OpenAI-style 503 with Retry-After, counted in the
    metrics; /health and /metrics answer all the while, and open idle connections take no call."""
    import socket

    llm = LLM(str(tiny_target))
    step = llm.router.target.submit_step
    llm.router.target.submit_step = lambda items: time.sleep(0.05) or step(items)  # calls last a while
    router = AsyncRouter(llm.router)
    server = OpenAIServer(router, llm.get_tokenizer(), "tiny", max_calls=2)
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 40, "ignore_eos": True}
    with BackgroundServer(server.app) as http:
        host, port = http.url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(5)]  # connected, sending nothing
        assert httpx.get(http.url + "/health").status_code == 200
        done = []
        calls = [threading.Thread(target=lambda: done.append(httpx.post(http.url + "/v1/chat/completions", json=body,
                                                                        timeout=60))) for _ in range(2)]
        for t in calls:
            t.start()
        deadline = time.monotonic() + 10
        while len(router.router.running) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = httpx.post(http.url + "/v1/chat/completions", json=body, timeout=60)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "service_unavailable_error"
        assert httpx.get(http.url + "/health").status_code == 200
        assert 'status="503"' in httpx.get(http.url + "/metrics").text
        for t in calls:
            t.join(timeout=30)
        assert [r.status_code for r in done] == [200, 200]
        assert httpx.post(http.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        for s in idle:
            s.close()
    router.shutdown()


def test_a_request_larger_than_the_queue_is_refused_as_the_clients_error(tiny_target):
    """prompts x n over max_waiting could never be queued: a 400 naming n, not a retryable 429 that
    claims the queue is full (it was idle); a batch that fits runs."""
    with Engine(tiny_target, max_waiting=4) as engine:
        body = {"prompt": [GOOD] * 3, "n": 2, "max_tokens": 2}
        too_big = post(engine.http.url, "/v1/completions", body)
        assert too_big.status_code == 400 and "Retry-After" not in too_big.headers
        error = too_big.json()["error"]
        assert error["param"] == "n" and "3 prompts x n=2: 6 sequences" in error["message"] and "queue of 4" in error["message"]
        alone = post(engine.http.url, "/v1/completions", {"prompt": GOOD, "n": 5, "max_tokens": 2})
        assert alone.status_code == 400 and alone.json()["error"]["param"] == "n"
        fits = post(engine.http.url, "/v1/completions", {**body, "prompt": [GOOD] * 2})
        assert fits.status_code == 200 and len(fits.json()["choices"]) == 4
        assert engine.idle()


@pytest.mark.parametrize("stream", [False, True])
def test_a_handler_cancelled_before_its_response_is_counted(engine, stream):
    """Ray Serve's proxy cancels the handler of a client that hung up (the replica's own server polls
    instead); a call cancelled before its first chunk, or unstreamed, was counted nowhere."""
    failures = engine.http_server.metrics.failures.labels("499")
    before = failures._value.get()
    engine.delay = 0.03
    body = {"prompt": GOOD, "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": stream}

    async def cancel_mid_call():
        transport = httpx.ASGITransport(app=engine.http_server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as c:
            call = asyncio.ensure_future(c.post("/v1/completions", json=body))
            await asyncio.sleep(0.3)  # admitted, not answered
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
    try:
        asyncio.run(cancel_mid_call())
        assert engine.idle() and failures._value.get() == before + 1
    finally:
        engine.delay = 0.003


def test_health_says_unavailable_once_the_engine_stopped(tiny_target):
    """It answered ok whatever the engine (a load balancer kept sending requests to a dead one)."""
    llm = LLM(str(tiny_target))
    router = AsyncRouter(llm.router)
    server = OpenAIServer(router, llm.get_tokenizer(), "tiny")
    with BackgroundServer(server.app) as http:
        assert httpx.get(http.url + "/health").json() == {"status": "ok"}
        router.shutdown()
        gone = httpx.get(http.url + "/health")
        assert gone.status_code == 503 and gone.json()["status"] == "unavailable"


def test_grpc_calls_past_the_limit_get_unavailable_while_health_checks_answer(tiny_target):
    """As HTTP's 503: grpcio's own limit answered RESOURCE_EXHAUSTED (which the SDK does not retry)
    and counted health checks, which then failed under load."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from specray.client import RetryPolicy
    from specray.cluster.serve.grpc_server import GrpcServerThread
    from specray.cluster.serve.grpc_service import GenerationService

    llm = LLM(str(tiny_target))
    step = llm.router.target.submit_step
    llm.router.target.submit_step = lambda items: time.sleep(0.05) or step(items)  # calls last a while
    router = AsyncRouter(llm.router)
    service = GenerationService(router, llm.get_tokenizer(), "tiny", max_calls=2)
    with GrpcServerThread(service) as server:
        done = []
        calls = [threading.Thread(target=lambda: done.append(Client(server.target, timeout=60).generate(
            [5, 6, 7], max_tokens=40, ignore_eos=True))) for _ in range(2)]
        for t in calls:
            t.start()
        deadline = time.monotonic() + 10
        while len(router.router.running) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with grpc.insecure_channel(server.target) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            once = Client(server.target, timeout=60, retry=RetryPolicy(max_attempts=1))
            with pytest.raises(SpecrayError) as refused:
                once.generate([5, 6, 7], max_tokens=40, ignore_eos=True)
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE and "calls in flight" in str(refused.value)
        for t in calls:
            t.join(timeout=30)
        assert len(done) == 2 and service.in_flight == 0
    router.shutdown()
