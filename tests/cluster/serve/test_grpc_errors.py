"""gRPC status codes: bad input, API key, deadlines, cancellation, overload, starting server;
each leaves the server serving and frees the engine's sequences."""

import asyncio
import pickle
import threading
import time

import grpc
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from specray import LLM
from specray.client import (
    AsyncClient,
    Client,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    RetryPolicy,
    UnauthenticatedError,
    UnavailableError,
)
from specray.client.request import build_request
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.serve.grpc_convert import GrpcAbort
from specray.cluster.serve.grpc_server import GrpcServerThread
from specray.cluster.serve.grpc_adapters import serve_stream, serve_unary
from specray.cluster.serve.grpc_service import CallInfo, GenerationService
from specray.protos.specray.v1 import generate_pb2 as pb
from specray.protos.specray.v1.generate_pb2_grpc import GenerationStub

KEY = "sk-grpc"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
PROMPT = "w20 w21 w22"
NOT_SERVING = HealthCheckResponse.NOT_SERVING
# 100+ rounds even where n-gram accepts every draft (the tiny model repeats itself): 2 s or more
# with slow_step
LONG = dict(max_tokens=400, ignore_eos=True, temperature=0)


@pytest.fixture(scope="module")
def served(tiny_target):
    llm = LLM(str(tiny_target), speculative_config=NGRAM)
    router = AsyncRouter(llm.router)
    router.aborted = []  # request ids the engine aborted (a spy on Router.abort)
    abort = llm.router.abort
    llm.router.abort = lambda request_id: (router.aborted.append(request_id), abort(request_id))
    step = llm.router.step

    def slow_step():  # >= 20 ms a round: LONG outlasts the deadlines below on any machine's kernels
        time.sleep(0.02)
        return step()
    llm.router.step = slow_step
    service = GenerationService(router, llm.get_tokenizer(), "tiny", api_key=KEY)
    with GrpcServerThread(service) as server:
        yield server, service, router
    router.shutdown()


@pytest.fixture()
def client(served):
    with Client(served[0].target, api_key=KEY, timeout=30) as c:
        yield c


def wait_idle(router: AsyncRouter, aborted_before: int | None = None, seconds: float = 10) -> bool:
    """The engine ran everything down (and, given `aborted_before`, aborted one more request:
    the sequence was freed early rather than run to max_tokens)."""
    end = time.monotonic() + seconds
    if aborted_before is not None:
        while len(router.aborted) == aborted_before and time.monotonic() < end:
            time.sleep(0.02)
        assert len(router.aborted) == aborted_before + 1
    while (router.router.has_unfinished() or router.router.reserved_tokens) and time.monotonic() < end:
        time.sleep(0.02)
    return not router.router.has_unfinished() and router.router.reserved_tokens == 0


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature=-1), "temperature"), (dict(top_p=2.0), "top_p"), (dict(max_tokens=0), "max_tokens"),
    (dict(n=0), "n must be"), (dict(top_k=-5), "top_k"), (dict(logprobs=-1), "logprobs"),
    (dict(num_speculative_tokens=-1), "num_speculative_tokens"), (dict(stop=[""]), "stop"),
    (dict(prompt=[]), "empty"), (dict(prompt=[5, 100000]), "token ids"), (dict(prompt="w3 " * 600), "context"),
    (dict(messages=[]), "messages"), (dict(messages=[{"role": "robot", "content": "w5"}]), "role"),
])
def test_bad_input_is_invalid_argument(client, kwargs, words):
    prompt = kwargs.pop("prompt", None if "messages" in kwargs else PROMPT)
    request = build_request([1] if prompt == [] else prompt, kwargs.pop("messages", None), **kwargs)
    if prompt == []:  # the SDK refuses it before any call (tests/protos); the server must too
        del request.token_ids.ids[:]
    for call in (lambda: client._unary(client._stub.Complete, request, 10),
                 lambda: list(client._stub.Generate(request, metadata=client._metadata, timeout=10))):
        with pytest.raises((InvalidArgumentError, grpc.RpcError)) as err:
            call()
        code = err.value.code if isinstance(err.value, InvalidArgumentError) else err.value.code()
        details = err.value.details if isinstance(err.value, InvalidArgumentError) else err.value.details()
        assert code == grpc.StatusCode.INVALID_ARGUMENT and words in details
    assert client.generate(PROMPT, max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize("kwargs, field", [(dict(prompt="w5 \ud800"), "prompt"),
                                           (dict(messages=[{"role": "user", "content": "\ud800"}]), "messages")])
def test_text_that_is_not_unicode_is_invalid_argument_in_the_sdk(client, kwargs, field):
    """Protobuf strings are UTF-8: the SDK raised the codec's UnicodeEncodeError."""
    call = client.chat if field == "messages" else client.generate
    with pytest.raises(InvalidArgumentError, match=f"{field}: not valid Unicode text"):
        call(*kwargs.values(), max_tokens=2)


def test_health_of_a_service_it_does_not_know(client):
    """The standard Check answers NOT_FOUND there; the SDK raised NotFoundError (and its docs)."""
    assert client.health("nope") == "SERVICE_UNKNOWN" and client.health() == "SERVING"


def test_missing_prompt_and_unknown_model(client):
    with pytest.raises(InvalidArgumentError, match="no prompt"):
        client._unary(client._stub.Complete, pb.GenerateRequest(), 10)
    with pytest.raises(NotFoundError, match="'other' does not exist"):
        client.generate(PROMPT, model="other", max_tokens=2)


def test_api_key(served):
    for key in (None, "wrong"):
        with Client(served[0].target, api_key=key, timeout=10) as bad:
            with pytest.raises(UnauthenticatedError):
                bad.generate(PROMPT, max_tokens=2)
            with pytest.raises(UnauthenticatedError):
                list(bad.stream(PROMPT, max_tokens=2))
            with pytest.raises(UnauthenticatedError):
                bad.models()
            assert bad.health() == "SERVING"  # the standard health service needs no key


def test_deadline_frees_the_sequence(client, served):
    router = served[2]
    n = len(router.aborted)
    # 1 s: LONG takes 2 s or more, and a busy CI box must still admit the request before its
    # deadline (at 0.3 s one run saw the deadline pass before any sequence existed to abort)
    with pytest.raises(DeadlineExceededError):
        client.generate(PROMPT, timeout=1.0, **LONG)
    assert wait_idle(router, n)
    with pytest.raises(DeadlineExceededError):
        list(client.stream(PROMPT, timeout=1.0, **LONG))
    assert wait_idle(router, n + 1)
    assert client.generate(PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_server_enforces_the_deadline_itself(served):
    """Even if no cancellation arrives (e.g. behind a proxy), the service aborts at the deadline."""
    service, router = served[1], served[2]
    request = build_request(PROMPT, **LONG)
    call = CallInfo((("authorization", f"Bearer {KEY}"),), time_remaining=0.2)
    n = len(router.aborted)
    with pytest.raises(GrpcAbort) as err:
        asyncio.run(service.complete(request, call))
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and "deadline" in err.value.details
    assert wait_idle(router, n)


def failures(service, status: str) -> float:
    return service.metrics.registry.get_sample_value("specray_request_failure_total", {"status": status}) or 0.0


def test_cancel_frees_the_sequence(client, served):
    """Each way a client leaves frees its sequence and counts once as 499 (the sync stream's break
    closes the handler at a yield, the async unary's cancel lands at an await)."""
    router = served[2]
    n, cancelled = len(router.aborted), failures(served[1], "499")
    with client.stream(PROMPT, **LONG) as stream:
        for delta in stream:
            assert delta.token_ids
            break  # leaving the loop cancels the call
    assert wait_idle(router, n)

    async def cancel_unary():
        async with AsyncClient(served[0].target, api_key=KEY) as c:
            task = asyncio.ensure_future(c.generate(PROMPT, **LONG))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            stream, seen = c.stream(PROMPT, **LONG), 0
            async for _ in stream:
                seen += 1
                stream.cancel()  # ends the loop without error
            assert seen == 1 and stream.summary is None

    async def break_off_five():  # five streams at once, each left after its third delta
        async with AsyncClient(served[0].target, api_key=KEY) as c:
            async def one():
                async with c.stream(PROMPT, **LONG) as stream:
                    seen = 0
                    async for _ in stream:
                        seen += 1
                        if seen == 3:
                            break
            await asyncio.gather(*[one() for _ in range(5)])

    asyncio.run(cancel_unary())
    asyncio.run(break_off_five())
    assert wait_idle(router) and len(router.aborted) == n + 8
    deadline = time.monotonic() + 5  # the handlers learn of the cancellations as the server polls
    while failures(served[1], "499") < cancelled + 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failures(served[1], "499") == cancelled + 8
    assert client.generate(PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_unavailable_while_starting_then_retries_succeed(tiny_target):
    llm = LLM(str(tiny_target))
    service = GenerationService(None, None, "tiny")
    with GrpcServerThread(service) as server:
        with Client(server.target, retry=RetryPolicy(max_attempts=1), timeout=10) as once:
            assert once.health() == "NOT_SERVING"
            assert asyncio.run(service.check_health(HealthCheckRequest(), CallInfo())).status == NOT_SERVING
            with pytest.raises(UnavailableError, match="starting"):
                once.generate(PROMPT, max_tokens=2)
        router = AsyncRouter(llm.router)
        threading.Timer(0.3, service.attach, (router, llm.get_tokenizer())).start()
        patient = RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.2)
        with Client(server.target, retry=patient, timeout=30) as c:
            assert c.generate(PROMPT, max_tokens=2).usage.completion_tokens == 2
            assert c.health() == "SERVING"
            router.shutdown()  # the engine stopped: as HTTP's /health turns 503
            assert c.health() == "NOT_SERVING"
            assert asyncio.run(service.check_health(HealthCheckRequest(), CallInfo())).status == NOT_SERVING


def test_health_watch_streams_serving_then_not_serving_once_the_router_stops(tiny_target):
    """A Watch (what load balancers and grpc clients subscribe to) hears what Check answers: NOT_SERVING
    while starting, SERVING once attached, NOT_SERVING after the router stopped."""
    from grpc_health.v1 import health_pb2_grpc

    llm = LLM(str(tiny_target))
    service = GenerationService(None, None, "tiny")
    with GrpcServerThread(service) as server, grpc.insecure_channel(server.target) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(HealthCheckRequest(service="specray.v1.Generation"),
                                                          timeout=30)
        assert next(watch).status == NOT_SERVING
        router = AsyncRouter(llm.router)
        service.attach(router, llm.get_tokenizer())
        assert next(watch).status == HealthCheckResponse.SERVING
        router.shutdown()
        assert next(watch).status == NOT_SERVING
        watch.cancel()


def test_retry_backoff_grows_and_is_capped():
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, multiplier=2.0)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (3, 0.8), (6, 1.0)]:
        assert ceiling / 2 <= policy.backoff(attempt) <= ceiling


# -- the Ray Serve adapters (a stand-in for RayServegRPCContext) ------------------------------
class FakeServeContext:
    def __init__(self, metadata):
        self.metadata, self.code, self.details = metadata, None, None

    def invocation_metadata(self):
        return self.metadata

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details


def test_serve_adapters_stream_and_set_status(served):
    service = served[1]
    ok = FakeServeContext([("authorization", f"Bearer {KEY}")])

    async def run():
        msgs = [m async for m in serve_stream(service.generate, build_request(PROMPT, max_tokens=3), ok)]
        models = await serve_unary(service.list_models, pb.ListModelsRequest(), ok)
        health = await serve_unary(service.check_health, HealthCheckRequest(service="specray.v1.Generation"), ok)
        assert health.status == HealthCheckResponse.SERVING
        unknown = FakeServeContext([])
        with pytest.raises(GrpcAbort):
            await serve_unary(service.check_health, HealthCheckRequest(service="nope"), unknown)
        assert unknown.code == grpc.StatusCode.NOT_FOUND
        bad = FakeServeContext([("authorization", f"Bearer {KEY}")])
        with pytest.raises(GrpcAbort) as err:
            await serve_unary(service.complete, build_request(PROMPT, max_tokens=0), bad)
        return msgs, models, bad, err.value

    msgs, models, bad, error = asyncio.run(run())
    assert msgs[-1].HasField("summary") and msgs[-1].summary.usage.completion_tokens == 3
    assert models.models[0].id == "tiny" and ok.code is None
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in bad.details
    again = pickle.loads(pickle.dumps(error))  # Serve ships the exception to its proxy
    assert (again.code, again.details) == (error.code, error.details)


def test_generated_stub_reaches_the_service(served):
    with grpc.insecure_channel(served[0].target) as channel:
        reply = GenerationStub(channel).ListModels(pb.ListModelsRequest(),
                                                   metadata=[("authorization", f"Bearer {KEY}")])
    assert [m.id for m in reply.models] == ["tiny"]
