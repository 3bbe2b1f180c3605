"""The blocking client."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc

from specray.client import _health
from specray.client._common import (DEFAULT_TARGET, Deadline, RetryPolicy, StreamOnce, call_metadata,
                                    channel_options, check_timeout, credentials, retry_policy, retry_wait)
from specray.client.errors import NotFoundError, from_rpc_error
from specray.client.request import Message, Prompt, Sampling, build_request
from specray.client.types import (Completion, Delta, Model, StreamSummary, assemble, completion_from_proto,
                                  delta_from_proto, model_from_proto, summary_from_proto)
from specray.protos.specray.v1 import generate_pb2 as pb
from specray.protos.specray.v1.generate_pb2_grpc import GenerationStub


class Stream:
    """Iterates a request's `Delta`s as the server decodes them; `summary` is set once the
    stream ended. Leaving the loop early (or `cancel()`) cancels the call, and the server frees
    the request."""

    def __init__(self, start, policy: RetryPolicy, deadline: Deadline, model: str):
        self._start, self._policy, self._deadline, self._model = start, policy, deadline, model
        self._call, self._cancelled = None, False
        self._once = StreamOnce()
        self.request_id = ""
        self.summary: StreamSummary | None = None

    def __iter__(self) -> Iterator[Delta]:
        self._once.begin()
        for attempt in itertools.count():
            if self._cancelled:  # also during a retry's backoff
                return
            self._call = self._start(self._deadline.remaining())
            received = False
            try:
                for msg in self._call:
                    received, self.request_id = True, msg.request_id
                    if msg.HasField("summary"):
                        self.summary = summary_from_proto(msg.request_id, msg.summary)
                    else:
                        yield self._once.seen(delta_from_proto(msg.delta))
                self._once.end()
                return
            except grpc.RpcError as e:
                if self._cancelled:
                    return  # cancel() ends the iteration quietly
                wait = None if received else retry_wait(e.code(), attempt, self._policy, self._deadline)
                if wait is None:
                    raise from_rpc_error(e) from None
            finally:
                self._call.cancel()  # a no-op once the call ended
            time.sleep(wait)

    def collect(self) -> Completion:
        """The full result: the whole stream drained, or (after a loop that read it to its end)
        the deltas that loop saw. A stream is one call: it never runs again."""
        deltas = self._once.all() if self._once.started else list(self)
        return assemble(deltas, self.summary, self._model)

    def cancel(self) -> None:
        """Cancel the call; an iteration in progress ends without error."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class Client:
    """Blocking client of a specray gRPC server.

    `timeout` is each call's default deadline in seconds (None: none); `retry` retries calls
    that fail UNAVAILABLE (None: never); `api_key` is sent as `authorization: Bearer <key>`; `tls` or
    `root_certificates` (PEM bytes or text, or a path) make the channel secure.
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, api_key: str | None = None, tls: bool = False,
                 root_certificates: bytes | str | Path | None = None, server_name: str | None = None,
                 timeout: float | None = None, retry: RetryPolicy | None = RetryPolicy(), model: str = "",
                 options: list[tuple[str, object]] | None = None):
        creds, opts = credentials(tls, root_certificates), channel_options(server_name, options)
        self._channel = grpc.secure_channel(target, creds, opts) if creds else grpc.insecure_channel(target, opts)
        self._stub = GenerationStub(self._channel)
        self._check = self._channel.unary_unary(_health.CHECK_METHOD,
                                                request_serializer=_health.HealthCheckRequest.SerializeToString,
                                                response_deserializer=_health.HealthCheckResponse.FromString)
        self._metadata, self.timeout = call_metadata(api_key), check_timeout(timeout)
        self.retry, self.model = retry_policy(retry), model

    # -- the API ----------------------------------------------------------------------------
    def generate(self, prompt: Prompt, *, sampling: Sampling | None = None, model: str | None = None,
                 timeout: float | None = None, **sampling_kwargs) -> Completion:
        """Complete a text or token-id prompt; sampling options as a `Sampling` or keywords."""
        request = build_request(prompt, None, self._model(model), sampling, **sampling_kwargs)
        return completion_from_proto(self._unary(self._stub.Complete, request, timeout))

    def chat(self, messages: Sequence[Message], *, sampling: Sampling | None = None, model: str | None = None,
             timeout: float | None = None, continue_final_message: bool = False,
             **sampling_kwargs) -> Completion:
        """Answer a conversation ([{"role": ..., "content": ...}, ...]) with the chat template
        (`continue_final_message`: continue the last message, e.g. a prefilled assistant reply;
        `add_generation_prompt=False`: no assistant turn opened after the messages)."""
        request = build_request(None, messages, self._model(model), sampling, continue_final_message,
                                **sampling_kwargs)
        return completion_from_proto(self._unary(self._stub.Complete, request, timeout))

    def stream(self, prompt: Prompt | None = None, *, messages: Sequence[Message] | None = None,
               sampling: Sampling | None = None, model: str | None = None, timeout: float | None = None,
               continue_final_message: bool = False, **sampling_kwargs) -> Stream:
        """Stream a prompt's (or a conversation's) output as `Delta`s."""
        request = build_request(prompt, messages, self._model(model), sampling, continue_final_message,
                                **sampling_kwargs)
        deadline = Deadline(self.timeout if timeout is None else check_timeout(timeout))
        start = lambda left: self._stub.Generate(request, timeout=left, metadata=self._metadata)  # noqa: E731
        return Stream(start, self.retry, deadline, request.model)

    def models(self, timeout: float | None = None) -> list[Model]:
        reply = self._unary(self._stub.ListModels, pb.ListModelsRequest(), timeout)
        return [model_from_proto(m) for m in reply.models]

    def health(self, service: str = "", timeout: float | None = None) -> str:
        """The standard health check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        try:
            reply = self._unary(self._check, _health.HealthCheckRequest(service=service), timeout)
        except NotFoundError:  # grpc.health.v1: Check answers NOT_FOUND for a service it does not know
            return "SERVICE_UNKNOWN"
        return _health.status_name(reply)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------
    def _model(self, model: str | None) -> str:
        return self.model if model is None else model

    def _unary(self, method, request, timeout: float | None):
        deadline = Deadline(self.timeout if timeout is None else check_timeout(timeout))
        for attempt in itertools.count():
            try:
                return method(request, timeout=deadline.remaining(), metadata=self._metadata)
            except grpc.RpcError as e:
                wait = retry_wait(e.code(), attempt, self.retry, deadline)
                if wait is None:
                    raise from_rpc_error(e) from None
            time.sleep(wait)
