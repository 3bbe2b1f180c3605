"""The `specray.v1.Generation` gRPC service over an AsyncRouter.

`GenerationService` is a plain class whose core methods take the request and a `CallInfo`
(metadata, time left) and raise `GrpcAbort(code, details)` on errors. Thin adapters turn them
into rpc handlers (cluster/serve/grpc_adapters.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2

from specray.cluster.outputs import RequestOutput
from specray.cluster.router.async_router import AsyncRouter
from specray.cluster.router.failures import request_failed
from specray.cluster.serve import grpc_convert as conv
from specray.cluster.serve.auth import authorized
from specray.cluster.serve.errors import REQUEST_ERRORS, http_status_label, status_of
from specray.cluster.serve.grpc_convert import GrpcAbort
from specray.cluster.serve.metrics import ServingMetrics
from specray.cluster.serve.prompts import PromptEncoder, PromptError
from specray.protos.specray.v1 import generate_pb2 as pb

Code = grpc.StatusCode
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name  # "specray.v1.Generation"


@dataclass(frozen=True)
class CallInfo:
    """What the service needs from an rpc's context."""

    metadata: Sequence[tuple[str, str | bytes]] = ()
    time_remaining: float | None = None  # seconds until the client's deadline; None: no deadline


class GenerationService:
    """Generate / Complete / ListModels over an AsyncRouter. Built without a router it answers
    UNAVAILABLE until `attach` hands it one (the model is still loading)."""

    def __init__(self, router: AsyncRouter | None, tokenizer, model_name: str, api_key: str | None = None,
                 metrics: ServingMetrics | None = None, default_max_tokens: int = 256,
                 speculative_method: str = "", max_calls: int | None = None, sampling_defaults: dict | None = None):
        """`max_calls`: Generate and Complete calls in flight at most; more get UNAVAILABLE (HTTP's 503).
        `sampling_defaults`: the model's, for options a request leaves unset."""
        self.model_name, self.api_key, self.default_max_tokens = model_name, api_key, default_max_tokens
        self.sampling_defaults = sampling_defaults or {}
        self.max_calls, self.in_flight = max_calls, 0
        self.speculative_method = speculative_method
        self.router, self.tokenizer, self.metrics = None, tokenizer, metrics
        self._on_ready: list[Callable[[], None]] = []
        if router is not None:
            self.attach(router, tokenizer, metrics)

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.router is not None

    @property
    def serving(self) -> bool:
        """Ready, and the router still takes turns (HTTP's /health says 503 otherwise)."""
        return self.router is not None and self.router.alive

    def attach(self, router: AsyncRouter, tokenizer, metrics: ServingMetrics | None = None) -> None:
        """Start serving with `router` (pass the HTTP app's ServingMetrics to share one registry)."""
        self.tokenizer, self.metrics = tokenizer, metrics or self.metrics or ServingMetrics(router)
        self.prompts = PromptEncoder.for_limits(tokenizer, router.router.config)
        self.router = router
        for callback in self._on_ready:
            callback()

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the service is ready (now, if it already is)."""
        self._on_ready.append(callback)
        if self.ready:
            callback()

    # -- rpcs -------------------------------------------------------------------------------
    async def generate(self, request: pb.GenerateRequest, call: CallInfo) -> AsyncIterator[pb.GenerateResponse]:
        """Generate: deltas as rounds commit tokens, then one summary."""
        start = time.monotonic()
        with self._slot():
            request_id, ids, params, prompt = await self._admit(request, call)
            tracker = conv.DeltaTracker(self.tokenizer, request_id, params.logprobs, params.skip_special_tokens)
            last = None
            try:
                async for out in self._run(ids, params, prompt, call):
                    last = out
                    for msg in tracker.deltas(out):
                        yield msg
            except (asyncio.CancelledError, GeneratorExit):  # closed at a yield: GeneratorExit
                self._left(start, call)
                raise
            summary = await self._render(params, lambda: conv.summary(self.tokenizer, request_id, self.model_name,
                                                                      last, params))
            self.metrics.succeeded(last.outputs[0].finish_reason)
        yield summary

    async def complete(self, request: pb.GenerateRequest, call: CallInfo) -> pb.CompleteResponse:
        """Complete: the full result."""
        start = time.monotonic()
        with self._slot():
            request_id, ids, params, prompt = await self._admit(request, call)
            last = None
            try:
                async for out in self._run(ids, params, prompt, call):
                    last = out
            except asyncio.CancelledError:
                self._left(start, call)
                raise
            response = await self._render(params, lambda: conv.complete_response(
                self.tokenizer, request_id, self.model_name, last, params))
            self.metrics.succeeded(last.outputs[0].finish_reason)
            return response

    async def list_models(self, request: pb.ListModelsRequest, call: CallInfo) -> pb.ListModelsResponse:
        self._authorize(call)
        self._require_ready()
        max_len = getattr(getattr(self.router.router, "config", None), "max_model_len", 0)
        return pb.ListModelsResponse(models=[pb.Model(id=self.model_name, owned_by="specray", max_model_len=max_len,
                                                      speculative_method=self.speculative_method)])

    async def check_health(self, request: health_pb2.HealthCheckRequest,
                           call: CallInfo) -> health_pb2.HealthCheckResponse:
        """`grpc.health.v1.Health/Check`, for Ray Serve, whose gRPC proxy has no health service
        (the standalone server uses grpcio-health-checking's servicer instead)."""
        if request.service not in ("", SERVICE_NAME):
            raise GrpcAbort(Code.NOT_FOUND, f"unknown service {request.service!r}")
        status = health_pb2.HealthCheckResponse.SERVING if self.serving else health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)

    # -- plumbing ---------------------------------------------------------------------------
    def _fail(self, code: grpc.StatusCode, details: str) -> GrpcAbort:
        if self.metrics is not None:
            self.metrics.failed(http_status_label(code))
        return GrpcAbort(code, details)

    def _left(self, start: float, call: CallInfo) -> None:
        """Count a call its client left, once: at its deadline (504, as the client sees
        DEADLINE_EXCEEDED) or before it (499)."""
        late = call.time_remaining is not None and time.monotonic() >= start + call.time_remaining - 0.05
        self._fail(Code.DEADLINE_EXCEEDED if late else Code.CANCELLED, "")

    def refuse(self, error: GrpcAbort) -> GrpcAbort:
        """Count a request refused before it reached the service (a malformed message)."""
        return self._fail(error.code, error.details)

    async def _render(self, params, build):
        """`build()`, off the event loop where it decodes logprobs (PromptEncoder.render)."""
        return await self.prompts.render(build, params.logprobs is not None or params.prompt_logprobs is not None)

    @contextmanager
    def _slot(self):
        """A call in flight: past `max_calls`, UNAVAILABLE at once (grpcio's own limit answered
        RESOURCE_EXHAUSTED and counted health checks too, which then failed under load). One event
        loop runs the calls: no lock."""
        if self.max_calls is not None and self.in_flight >= self.max_calls:
            raise self._fail(Code.UNAVAILABLE, f"the server is at its {self.max_calls} calls in flight; retry")
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def _authorize(self, call: CallInfo) -> None:
        if not authorized(dict(call.metadata).get("authorization"), self.api_key):
            raise self._fail(Code.UNAUTHENTICATED, "missing or wrong API key (metadata authorization: Bearer <key>)")

    def _require_ready(self) -> None:
        if not self.ready:
            raise self._fail(Code.UNAVAILABLE, "server is starting: the model is still loading; retry shortly")

    async def _admit(self, request: pb.GenerateRequest, call: CallInfo):
        """Check access and translate the request; bad input raises INVALID_ARGUMENT or NOT_FOUND."""
        self._authorize(call)
        self._require_ready()
        if request.model not in ("", self.model_name):
            raise self._fail(Code.NOT_FOUND, f"model {request.model!r} does not exist; "
                                             f"this server serves {self.model_name!r}")
        try:
            salt = request.cache_salt if request.HasField("cache_salt") else None
            params = conv.sampling_params(request.sampling, self.default_max_tokens, salt, self.sampling_defaults)
            prompt, ids = await conv.prompt_input(self.prompts, request, params.truncate_prompt_tokens)
            if request.sampling.HasField("max_tokens"):
                self.prompts.check_room(len(ids), params.max_tokens, truncate=params.truncate_prompt_tokens)
        except GrpcAbort as e:
            raise self._fail(e.code, e.details) from None
        except PromptError as e:
            raise self._fail(Code.INVALID_ARGUMENT, str(e)) from None
        return f"gen-{uuid.uuid4().hex[:24]}", ids, params, prompt

    async def _run(self, ids: list[int], params, prompt: str | None, call: CallInfo) -> AsyncIterator[RequestOutput]:
        """The router's outputs for one request, within the call's deadline. Leaving early
        (error, deadline, cancellation) closes the router stream, which frees the sequence."""
        start, first, last = time.monotonic(), None, None
        end = None if call.time_remaining is None else start + call.time_remaining
        try:
            async with aclosing(self.router.generate(ids, params, prompt)) as outputs:
                while True:
                    try:
                        out = await self._next(outputs, end)
                    except StopAsyncIteration:
                        break
                    if first is None and any(c.token_ids for c in out.outputs):
                        first = time.monotonic()
                    last = out
                    yield out
        except asyncio.TimeoutError:
            raise self._fail(Code.DEADLINE_EXCEEDED, f"deadline exceeded after {time.monotonic() - start:.2f}s; "
                                                     "the request was aborted") from None
        except REQUEST_ERRORS as e:
            raise self._fail(status_of(e).grpc, str(e)) from None
        except Exception as e:  # noqa: BLE001 - a bug: the client gets a reference, the log the rest
            raise self._fail(Code.INTERNAL, str(request_failed("grpc", e))) from None
        if last is not None:
            tokens = max(len(c.token_ids) for c in last.outputs)
            self.metrics.observe(start, first, time.monotonic(), tokens)

    @staticmethod
    async def _next(outputs: AsyncIterator[RequestOutput], end: float | None) -> RequestOutput:
        if end is None:
            return await outputs.__anext__()
        # on timeout wait_for cancels the pending step, which aborts the request in the engine
        return await asyncio.wait_for(outputs.__anext__(), max(0.0, end - time.monotonic()))
