"""One error vocabulary for the HTTP and gRPC APIs: each user-visible case with its HTTP status, gRPC
code and OpenAI error type, and the router's exceptions mapped onto them."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from specray.cluster.pools.api import TargetUnavailable
from specray.cluster.router.async_router import QueueFullError

Code = grpc.StatusCode


@dataclass(frozen=True)
class Status:
    http: int
    grpc: grpc.StatusCode
    openai_type: str  # the OpenAI error body's "type"

    @property
    def retryable(self) -> bool:
        """The client may retry at once (Retry-After on HTTP)."""
        return self.grpc in (Code.RESOURCE_EXHAUSTED, Code.UNAVAILABLE)


INVALID = Status(400, Code.INVALID_ARGUMENT, "invalid_request_error")
UNAUTHENTICATED = Status(401, Code.UNAUTHENTICATED, "authentication_error")
NOT_FOUND = Status(404, Code.NOT_FOUND, "not_found_error")
QUEUE_FULL = Status(429, Code.RESOURCE_EXHAUSTED, "rate_limit_error")
CANCELLED = Status(499, Code.CANCELLED, "cancelled_error")
INTERNAL = Status(500, Code.INTERNAL, "internal_error")
UNAVAILABLE = Status(503, Code.UNAVAILABLE, "service_unavailable_error")
DEADLINE = Status(504, Code.DEADLINE_EXCEEDED, "timeout_error")
STATUSES = (INVALID, UNAUTHENTICATED, NOT_FOUND, QUEUE_FULL, CANCELLED, INTERNAL, UNAVAILABLE, DEADLINE)
BY_GRPC = {s.grpc: s for s in STATUSES}
BY_HTTP = {s.http: s for s in STATUSES}

# The router's exceptions a request can end with, most specific first.
ROUTER_ERRORS: tuple[tuple[type[Exception], Status], ...] = (
    (QueueFullError, QUEUE_FULL),  # admission refused: the waiting queue is full
    (TargetUnavailable, UNAVAILABLE),  # the target lost its KV; retrying is safe
    (ValueError, INVALID),  # the request itself is bad
)
CLIENT_ERRORS = tuple(kind for kind, _ in ROUTER_ERRORS)


def status_of(exc: BaseException) -> Status:
    """The status a router exception answers with (INTERNAL for anything unexpected)."""
    return next((status for kind, status in ROUTER_ERRORS if isinstance(exc, kind)), INTERNAL)


def http_status_label(code: grpc.StatusCode) -> str:
    """`specray_request_failure{status=...}` counts HTTP and gRPC failures alike, by HTTP status."""
    return str(BY_GRPC.get(code, INTERNAL).http)
