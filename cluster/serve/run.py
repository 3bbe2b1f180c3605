"""Deploy the Serve application on the connected Ray cluster (used by `specray serve` and tests)."""

from __future__ import annotations

import importlib.util
import logging
import math

GRPC_SERVICERS = ["specray.protos.specray.v1.generate_pb2_grpc.add_GenerationServicer_to_server",
                  "grpc_health.v1.health_pb2_grpc.add_HealthServicer_to_server"]


def grpc_available() -> bool:
    return importlib.util.find_spec("specray.protos.specray.v1.generate_pb2_grpc") is not None


def proxy_keep_alive(http) -> int:
    """Serve's proxy takes whole seconds (a fraction failed serve.start); the replica's own server
    keeps the configured value."""
    return math.ceil(http.keep_alive_timeout_s)


def run_serve(cfg, app_name: str = "specray", proxy_location: str | None = None) -> dict:
    """Start Serve's HTTP (and gRPC) proxies and deploy; returns what was started."""
    from ray import serve
    from ray.serve.config import HTTPOptions, gRPCOptions

    from specray.cluster.serve.app import build_app
    from specray.cluster.serve.runtime import resolve_colocation

    grpc = cfg.grpc.enabled and grpc_available()
    proxy = grpc and cfg.grpc.server == "proxy"  # else the replica serves gRPC itself (cluster/serve/app.py)
    grpc_options = gRPCOptions(port=cfg.grpc.port, grpc_servicer_functions=GRPC_SERVICERS) if proxy else None
    if not proxy and cfg.http.server == "replica":  # the replica serves both APIs: no Serve proxy at all
        proxy_location = "Disabled"
    extra = {"proxy_location": proxy_location} if proxy_location else {}
    http = HTTPOptions(host=cfg.http.host, port=cfg.http.port, keep_alive_timeout_s=proxy_keep_alive(cfg.http))
    serve.start(http_options=http, grpc_options=grpc_options, **extra)
    cfg = for_replicas(resolve_colocation(cfg))
    serve_logger = logging.getLogger("ray.serve")
    serve_logger.addFilter(quiet_reconnect)
    try:
        serve.run(build_app({"config": cfg.model_dump()}), name=app_name, route_prefix="/")
    finally:
        serve_logger.removeFilter(quiet_reconnect)
    return {"grpc": grpc, "api_key": cfg.http.api_key is not None, "colocated": cfg.pools.colocate}


def quiet_reconnect(record: logging.LogRecord) -> bool:
    """Drops `serve.run`'s note that it connects to the running Serve instance and that "new
    http_options ... will not be applied": the instance is the one serve.start just started with
    these very options, and the note read as if --port or --host had been ignored."""
    return "Connecting to existing Serve app" not in record.getMessage()


def for_replicas(cfg):
    """The config the replicas get: the API key resolved here, where `specray serve` runs (its
    variable or key file may not exist where a joined cluster places the replica, which then served
    without a key while the banner asked for one)."""
    key = cfg.http.resolved_api_key()
    if key is None:
        return cfg
    return cfg.model_copy(update={"http": cfg.http.model_copy(update={"api_key": key, "api_key_file": None})})
