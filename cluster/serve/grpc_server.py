"""A standalone `grpc.aio` server for the Generation service, with the standard health service
(`grpc.health.v1`: NOT_SERVING until the router is attached) and server reflection. Ray Serve
deployments do not use this module: they call GenerationService through cluster/serve/grpc_adapters.py."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from google.protobuf.message import DecodeError

from specray.cluster.config.defaults import DEFAULT_MAX_REQUEST_BYTES
from specray.cluster.serve.grpc_convert import Malformed
from specray.cluster.serve.grpc_adapters import GenerationServicer
from specray.cluster.serve.grpc_service import SERVICE_NAME, GenerationService
from specray.cluster.serve.http_server import free_port
from specray.protos.specray.v1 import generate_pb2 as pb


def _lenient(message_cls):
    """A request deserializer that hands malformed bytes to the handler (INVALID_ARGUMENT there)
    instead of raising, which grpc would answer with UNKNOWN."""
    def parse(data: bytes):
        try:
            return message_cls.FromString(data)
        except DecodeError as e:
            return Malformed(message_cls.DESCRIPTOR.full_name, str(e))
    return parse


def _generation_handlers(servicer: GenerationServicer) -> grpc.GenericRpcHandler:
    service = pb.DESCRIPTOR.services_by_name["Generation"]
    handlers = {}
    for method in service.methods:
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(getattr(servicer, method.name),
                                     request_deserializer=_lenient(getattr(pb, method.input_type.name)),
                                     response_serializer=lambda message: message.SerializeToString())
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


@dataclass(frozen=True)
class GrpcLimits:
    """What one client may hold of the server (GrpcConfig's fields of the same names)."""

    max_message_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_concurrent_streams: int = 1000
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    idle_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        assert self.max_message_bytes >= 1 and self.max_concurrent_streams >= 1
        assert min(self.keepalive_time_s, self.keepalive_timeout_s, self.idle_timeout_s) > 0

    def options(self) -> list[tuple[str, int]]:
        ms = lambda seconds: max(1, round(seconds * 1000))  # noqa: E731
        return [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_concurrent_streams", self.max_concurrent_streams),
                # a peer that stops answering pings (its machine gone) is closed and its calls cancelled
                ("grpc.keepalive_time_ms", ms(self.keepalive_time_s)),
                ("grpc.keepalive_timeout_ms", ms(self.keepalive_timeout_s)),
                ("grpc.http2.ping_timeout_ms", ms(self.keepalive_timeout_s)),  # grpcio >= 1.6x waits this for the ack
                ("grpc.max_connection_idle_ms", ms(self.idle_timeout_s)),
                # gRPC sets SO_REUSEPORT by default on Linux: a second server on a taken port would share it
                ("grpc.so_reuseport", 0)]


async def serve_grpc(service: GenerationService, port: int, host: str = "127.0.0.1",
                     credentials: grpc.ServerCredentials | None = None,
                     limits: GrpcLimits = GrpcLimits()) -> grpc.aio.Server:
    """Start serving `service` on host:port (TLS with `credentials`); returns the started server.
    Call it inside the event loop that runs the server; `await server.stop(grace)` ends it. The
    service bounds its own calls in flight (GenerationService.max_calls)."""
    server = grpc.aio.server(options=limits.options())
    server.add_generic_rpc_handlers((_generation_handlers(GenerationServicer(service)),))
    health_servicer = _Health(service)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{host}:{port}"
    bound = (server.add_secure_port(address, credentials) if credentials
             else server.add_insecure_port(address))
    if bound == 0:
        raise RuntimeError(f"could not bind the gRPC server to {address}")
    await _track_readiness(service, health_servicer)
    await server.start()
    return server


STOPPED_POLL_S = 0.5  # how soon Watch hears that the router stopped (Check answers at once)


class _Health(health.aio.HealthServicer):
    """grpc.health.v1 with the statuses `_track_readiness` sets, and NOT_SERVING on Check once the
    router stopped taking turns (as HTTP's /health turns 503)."""

    def __init__(self, service: GenerationService):
        super().__init__()
        self._service = service

    async def Check(self, request, context):
        response = await super().Check(request, context)
        if response is not None and response.status == health_pb2.HealthCheckResponse.SERVING \
                and not self._service.serving:
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return response


async def _track_readiness(service: GenerationService, servicer, poll_s: float = STOPPED_POLL_S) -> None:
    """Overall and per-service health: NOT_SERVING until the service is ready, SERVING while the
    router takes turns, NOT_SERVING once it stopped, so `Watch` streams what `Check` answers."""
    async def set_all(status) -> None:
        for name in ("", SERVICE_NAME):
            await servicer.set(name, status)

    async def serving_until_stopped() -> None:
        await set_all(health_pb2.HealthCheckResponse.SERVING)
        while service.serving:  # a stopped router never resumes: its replica restarts
            await asyncio.sleep(poll_s)
        await set_all(health_pb2.HealthCheckResponse.NOT_SERVING)

    await set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
    loop = asyncio.get_running_loop()
    # `attach` may run on another thread (the model loads off the loop)
    service.on_ready(lambda: asyncio.run_coroutine_threadsafe(serving_until_stopped(), loop))


class GrpcServerThread:
    """Runs `serve_grpc` on its own event loop in a background thread, for blocking callers
    (tests, the CLI). Use as a context manager; `target` is "host:port" for clients."""

    def __init__(self, service: GenerationService, host: str = "127.0.0.1", port: int | None = None,
                 credentials: grpc.ServerCredentials | None = None, limits: GrpcLimits = GrpcLimits()):
        self.service, self.host, self.port = service, host, port or free_port(host)
        self.credentials, self.limits = credentials, limits
        self.loop = asyncio.new_event_loop()
        self.server: grpc.aio.Server | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, name="specray-grpc", daemon=True)

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __enter__(self) -> "GrpcServerThread":
        self.thread.start()
        started = asyncio.run_coroutine_threadsafe(
            serve_grpc(self.service, self.port, self.host, self.credentials, self.limits), self.loop)
        self.server = started.result(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(grace=1), self.loop).result(timeout=10)
        asyncio.run_coroutine_threadsafe(_cancel_tasks(), self.loop).result(timeout=10)  # the health poll
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


async def _cancel_tasks() -> None:
    """Cancel what still runs on this loop but this task, and wait until it ended."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
