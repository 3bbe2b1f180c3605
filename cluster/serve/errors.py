"""One error vocabulary for the HTTP and gRPC APIs: each user-visible case with its HTTP status, gRPC
code and OpenAI error type, and the router's exceptions mapped onto them."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from specray.cluster.pools.api import TargetUnavailable
from specray.cluster.router.async_router import QueueFullError, RouterStopped
from specray.cluster.router.failures import RequestFailed

Code = grpc.StatusCode


@dataclass(frozen=True)
class Status:
    http: int
    grpc: grpc.StatusCode
    openai_type: str  # the OpenAI error body's "type"
    retryable: bool = False  # the client may retry at once (Retry-After on HTTP)


INVALID = Status(400, Code.INVALID_ARGUMENT, "invalid_request_error")
UNAUTHENTICATED = Status(401, Code.UNAUTHENTICATED, "authentication_error")
NOT_FOUND = Status(404, Code.NOT_FOUND, "not_found_error")
TOO_LARGE = Status(413, Code.RESOURCE_EXHAUSTED, "invalid_request_error")  # body or message over the limit
HEADERS_TOO_LARGE = Status(431, Code.RESOURCE_EXHAUSTED, "invalid_request_error")
QUEUE_FULL = Status(429, Code.RESOURCE_EXHAUSTED, "rate_limit_error", retryable=True)
CANCELLED = Status(499, Code.CANCELLED, "cancelled_error")
INTERNAL = Status(500, Code.INTERNAL, "internal_error")
UNAVAILABLE = Status(503, Code.UNAVAILABLE, "service_unavailable_error", retryable=True)
DEADLINE = Status(504, Code.DEADLINE_EXCEEDED, "timeout_error")
STATUSES = (INVALID, UNAUTHENTICATED, NOT_FOUND, TOO_LARGE, HEADERS_TOO_LARGE, QUEUE_FULL, CANCELLED, INTERNAL,
            UNAVAILABLE, DEADLINE)
BY_GRPC = {s.grpc: s for s in STATUSES if s not in (TOO_LARGE, HEADERS_TOO_LARGE)}  # RESOURCE_EXHAUSTED: 429
BY_HTTP = {s.http: s for s in STATUSES}

# The router's exceptions a request can end with, most specific first.
ROUTER_ERRORS: tuple[tuple[type[Exception], Status], ...] = (
    (QueueFullError, QUEUE_FULL),  # admission refused: the waiting queue is full
    (TargetUnavailable, UNAVAILABLE),  # the target lost its KV; retrying is safe
    (RouterStopped, UNAVAILABLE),  # the replica is shutting down or restarting
    (RequestFailed, INTERNAL),  # a bug met this request alone; its message carries only a reference
    (ValueError, INVALID),  # the request itself is bad
)
REQUEST_ERRORS = tuple(kind for kind, _ in ROUTER_ERRORS)


def status_of(exc: BaseException) -> Status:
    """The status a router exception answers with (INTERNAL for anything unexpected)."""
    return next((status for kind, status in ROUTER_ERRORS if isinstance(exc, kind)), INTERNAL)


def http_status_label(code: grpc.StatusCode) -> str:
    """`specray_request_failure{status=...}` counts HTTP and gRPC failures alike, by HTTP status."""
    return str(BY_GRPC.get(code, INTERNAL).http)
