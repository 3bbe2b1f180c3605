"""The asyncio client: the same API as `Client`, with coroutines and async iteration."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import grpc.aio

from specray.client import _health
from specray.client._common import (DEFAULT_TARGET, Deadline, RetryPolicy, StreamOnce, call_metadata,
                                    channel_options, check_timeout, credentials, retry_policy, retry_wait)
from specray.client.errors import NotFoundError, from_rpc_error
from specray.client.request import Message, Prompt, Sampling, build_request
from specray.client.types import (Completion, Delta, Model, StreamSummary, assemble, completion_from_proto,
                                  delta_from_proto, model_from_proto, summary_from_proto)
from specray.protos.specray.v1 import generate_pb2 as pb
from specray.protos.specray.v1.generate_pb2_grpc import GenerationStub


class AsyncStream:
    """`async for delta in stream`; `summary` is set once the stream ended. Leaving
    `async with stream:` (or `cancel()`) cancels the call, and the server frees the request."""

    def __init__(self, start, policy: RetryPolicy, deadline: Deadline, model: str):
        self._start, self._policy, self._deadline, self._model = start, policy, deadline, model
        self._call, self._cancelled = None, False
        self._once = StreamOnce()
        self.request_id = ""
        self.summary: StreamSummary | None = None

    def __aiter__(self) -> AsyncIterator[Delta]:
        self._once.begin()
        return self._events()

    async def _events(self) -> AsyncIterator[Delta]:
        for attempt in itertools.count():
            if self._cancelled:  # also during a retry's backoff
                return
            self._call = self._start(self._deadline.remaining())
            received = False
            try:
                async for msg in self._call:
                    received, self.request_id = True, msg.request_id
                    if msg.HasField("summary"):
                        self.summary = summary_from_proto(msg.request_id, msg.summary)
                    else:
                        yield self._once.seen(delta_from_proto(msg.delta))
                self._once.end()
                return
            except asyncio.CancelledError:
                if not self._cancelled:  # grpc.aio reports a local cancel() this way
                    raise
                return
            except grpc.aio.AioRpcError as e:
                if self._cancelled:
                    return  # cancel() ends the iteration quietly
                wait = None if received else retry_wait(e.code(), attempt, self._policy, self._deadline)
                if wait is None:
                    raise from_rpc_error(e) from None
            finally:
                self._call.cancel()  # a no-op once the call ended
            await asyncio.sleep(wait)

    async def collect(self) -> Completion:
        """The full result: the whole stream drained, or (after a loop that read it to its end)
        the deltas that loop saw. A stream is one call: it never runs again."""
        deltas = self._once.all() if self._once.started else [d async for d in self]
        return assemble(deltas, self.summary, self._model)

    def cancel(self) -> None:
        """Cancel the call; an iteration in progress ends without error."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc) -> None:
        self.cancel()


class AsyncClient:
    """asyncio client of a specray gRPC server; options as for `Client`. Its channel opens in the
    event loop of its first call and serves that loop only (grpc.aio channels belong to one loop)."""

    def __init__(self, target: str = DEFAULT_TARGET, *, api_key: str | None = None, tls: bool = False,
                 root_certificates: bytes | str | Path | None = None, server_name: str | None = None,
                 timeout: float | None = None, retry: RetryPolicy | None = RetryPolicy(), model: str = "",
                 options: list[tuple[str, object]] | None = None):
        self._open = (target, credentials(tls, root_certificates), channel_options(server_name, options))
        self._channel = self._loop = None
        self._metadata, self.timeout = call_metadata(api_key), check_timeout(timeout)
        self.retry, self.model = retry_policy(retry), model

    # -- the API ----------------------------------------------------------------------------
    async def generate(self, prompt: Prompt, *, sampling: Sampling | None = None, model: str | None = None,
                       timeout: float | None = None, **sampling_kwargs) -> Completion:
        """Complete a text or token-id prompt; sampling options as a `Sampling` or keywords."""
        request = build_request(prompt, None, self._model(model), sampling, **sampling_kwargs)
        return completion_from_proto(await self._unary(self._stub.Complete, request, timeout))

    async def chat(self, messages: Sequence[Message], *, sampling: Sampling | None = None,
                   model: str | None = None, timeout: float | None = None, continue_final_message: bool = False,
                   **sampling_kwargs) -> Completion:
        """Answer a conversation ([{"role": ..., "content": ...}, ...]) with the chat template
        (`continue_final_message`: continue the last message, e.g. a prefilled assistant reply;
        `add_generation_prompt=False`: no assistant turn opened after the messages)."""
        request = build_request(None, messages, self._model(model), sampling, continue_final_message,
                                **sampling_kwargs)
        return completion_from_proto(await self._unary(self._stub.Complete, request, timeout))

    def stream(self, prompt: Prompt | None = None, *, messages: Sequence[Message] | None = None,
               sampling: Sampling | None = None, model: str | None = None, timeout: float | None = None,
               continue_final_message: bool = False, **sampling_kwargs) -> AsyncStream:
        """Stream a prompt's (or a conversation's) output as `Delta`s."""
        request = build_request(prompt, messages, self._model(model), sampling, continue_final_message,
                                **sampling_kwargs)
        deadline = Deadline(self.timeout if timeout is None else check_timeout(timeout))
        start = lambda left: self._stub.Generate(request, timeout=left, metadata=self._metadata)  # noqa: E731
        return AsyncStream(start, self.retry, deadline, request.model)

    async def models(self, timeout: float | None = None) -> list[Model]:
        reply = await self._unary(self._stub.ListModels, pb.ListModelsRequest(), timeout)
        return [model_from_proto(m) for m in reply.models]

    async def health(self, service: str = "", timeout: float | None = None) -> str:
        """The standard health check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        try:
            reply = await self._unary(self._check, _health.HealthCheckRequest(service=service), timeout)
        except NotFoundError:  # grpc.health.v1: Check answers NOT_FOUND for a service it does not know
            return "SERVICE_UNKNOWN"
        return _health.status_name(reply)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- plumbing ---------------------------------------------------------------------------
    def _model(self, model: str | None) -> str:
        return self.model if model is None else model

    @property
    def _stub(self) -> GenerationStub:
        """The stub of this loop's channel, opened at the first call (one built outside the loop that
        uses it failed with grpc's "attached to a different loop")."""
        loop = asyncio.get_running_loop()
        if self._channel is None:
            target, creds, opts = self._open
            self._channel = (grpc.aio.secure_channel(target, creds, opts) if creds
                             else grpc.aio.insecure_channel(target, opts))
            self._loop, self._generation = loop, GenerationStub(self._channel)
            self._health = self._channel.unary_unary(
                _health.CHECK_METHOD, request_serializer=_health.HealthCheckRequest.SerializeToString,
                response_deserializer=_health.HealthCheckResponse.FromString)
        elif loop is not self._loop:
            raise RuntimeError("this AsyncClient's channel belongs to the event loop of its first call; "
                               "create an AsyncClient in each event loop")
        return self._generation

    @property
    def _check(self):
        self._stub  # noqa: B018 - opens the channel in this loop, or refuses another loop
        return self._health

    async def _unary(self, method, request, timeout: float | None):
        deadline = Deadline(self.timeout if timeout is None else check_timeout(timeout))
        for attempt in itertools.count():
            try:
                return await method(request, timeout=deadline.remaining(), metadata=self._metadata)
            except grpc.aio.AioRpcError as e:
                wait = retry_wait(e.code(), attempt, self.retry, deadline)
                if wait is None:
                    raise from_rpc_error(e) from None
            await asyncio.sleep(wait)
