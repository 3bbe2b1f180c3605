"""Exceptions of the client SDK; each carries the call's gRPC status code and details."""

from __future__ import annotations

import grpc


class SpecrayError(Exception):
    """A failed call: `code` is the gRPC status code, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details

    def __reduce__(self):  # pickles (Ray, multiprocessing) by its two arguments, not its message
        return type(self), (self.code, self.details)


class InvalidArgumentError(SpecrayError):
    """Bad parameters or prompt; the details say which."""


class NotFoundError(SpecrayError):
    """The server does not serve the requested model."""


class UnauthenticatedError(SpecrayError):
    """Missing or wrong API key."""


class ResourceExhaustedError(SpecrayError):
    """The server's queue is full (retry later), or a message passed a size limit (the details say)."""


class UnavailableError(SpecrayError):
    """The server is starting or unreachable (retried with backoff before this is raised)."""


class DeadlineExceededError(SpecrayError):
    """The call's deadline passed; the server frees the request."""


class CallCancelledError(SpecrayError):
    """The call was cancelled."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CallCancelledError,
}


def from_rpc_error(error: grpc.RpcError) -> SpecrayError:
    """The SDK exception for a failed call (sync `grpc.RpcError` or `grpc.aio.AioRpcError`)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    return _BY_CODE.get(code, SpecrayError)(code, details)
