"""The `specray.v1.Generation` service's rpc adapters (cluster/serve/grpc_service.py): `GenerationServicer`
for a standalone `grpc.aio` server, `serve_unary` / `serve_stream` for Ray Serve's gRPC ingress, whose
deployment methods receive `(request, grpc_context: RayServegRPCContext)`. A GrpcAbort ends the rpc
with its status; anything else is INTERNAL with a log reference."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, contextmanager

import grpc

from specray.cluster.router.failures import request_failed
from specray.cluster.serve import grpc_convert as conv
from specray.cluster.serve.grpc_convert import GrpcAbort
from specray.cluster.serve.grpc_service import CallInfo, Code, GenerationService
from specray.protos.specray.v1 import generate_pb2_grpc


def _as_abort(error: Exception) -> GrpcAbort:
    """The status an rpc ends with: a GrpcAbort's own; anything else is a bug outside the engine
    (never the client's mistake): INTERNAL with a log reference."""
    return error if isinstance(error, GrpcAbort) else GrpcAbort(Code.INTERNAL, str(request_failed("grpc", error)))


class GenerationServicer(generate_pb2_grpc.GenerationServicer):
    """The service as `grpc.aio` handlers: GrpcAbort becomes `context.abort`."""

    def __init__(self, service: GenerationService):
        self.service = service

    async def Generate(self, request, context: grpc.aio.ServicerContext):
        try:
            if isinstance(request, conv.Malformed):
                raise self.service.refuse(request.abort())
            async with aclosing(self.service.generate(request, aio_call_info(context))) as stream:
                async for msg in stream:
                    yield msg
        except Exception as e:  # noqa: BLE001 - every error ends the rpc with a status
            error = _as_abort(e)
            await context.abort(error.code, error.details)

    async def Complete(self, request, context: grpc.aio.ServicerContext):
        return await self._unary(self.service.complete, request, context)

    async def ListModels(self, request, context: grpc.aio.ServicerContext):
        return await self._unary(self.service.list_models, request, context)

    async def _unary(self, method, request, context: grpc.aio.ServicerContext):
        try:
            if isinstance(request, conv.Malformed):
                raise self.service.refuse(request.abort())
            return await method(request, aio_call_info(context))
        except Exception as e:  # noqa: BLE001 - every error ends the rpc with a status
            error = _as_abort(e)
            await context.abort(error.code, error.details)


def aio_call_info(context: grpc.aio.ServicerContext) -> CallInfo:
    return CallInfo(tuple(context.invocation_metadata() or ()), context.time_remaining())


def serve_call_info(grpc_context) -> CallInfo:
    """Ray Serve's RayServegRPCContext carries metadata but no deadline: the Serve proxy
    enforces the client's deadline by cancelling the replica call, which frees the request."""
    return CallInfo(tuple(grpc_context.invocation_metadata()) if grpc_context is not None else ())


@contextmanager
def _serve_status(grpc_context):
    """Serve returns the code/details set on the context when the method then raises."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - every error ends the rpc with a status
        error = _as_abort(e)
        if grpc_context is not None:
            grpc_context.set_code(error.code)
            grpc_context.set_details(error.details)
        if error is e:
            raise
        raise error from None


async def serve_unary(method, request, grpc_context):
    """Run a unary core method (`service.complete`, `service.list_models`) for Ray Serve."""
    with _serve_status(grpc_context):
        return await method(request, serve_call_info(grpc_context))


async def serve_stream(method, request, grpc_context) -> AsyncIterator:
    """Run a streaming core method (`service.generate`) for Ray Serve."""
    with _serve_status(grpc_context):
        async with aclosing(method(request, serve_call_info(grpc_context))) as stream:
            async for msg in stream:
                yield msg
