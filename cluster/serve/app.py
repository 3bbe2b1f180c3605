"""The Ray Serve application: one deployment that owns the router and serves the OpenAI HTTP API
(and the gRPC API through Serve's gRPC ingress) over it.

The router is stateful (running sequences, in-flight groups), so the deployment runs one replica;
the pools it drives scale separately. `build_app` is the import path a RayService's serveConfigV2
points at: `specray.cluster.serve.app:build_app` with args `{"config": {...ServeConfig...}}`.
"""

from __future__ import annotations

from typing import Any

from specray.cluster.config.serve import ServeConfig
from specray.cluster.pools.heap import freeze_startup_heap
from specray.cluster.serve.grpc_adapters import serve_stream, serve_unary
from specray.cluster.serve.grpc_service import GenerationService
from specray.cluster.serve.openai_api import OpenAIServer
from specray.cluster.serve.runtime import build_runtime, resolve_colocation


class SpecrayServer:
    """A plain class; cluster/pools/builder.py turns it into the Serve deployment. HTTP and gRPC share
    one router and one Prometheus registry."""

    def __init__(self, config: dict[str, Any]):
        self.config = ServeConfig.from_dict(config)
        self.runtime = build_runtime(self.config)
        rt, cfg = self.runtime, self.config
        self.http = OpenAIServer(rt.async_router, rt.tokenizer, cfg.model_name, rt.api_key, cfg.http.default_max_tokens,
                                 cfg.http.max_request_bytes, self._max_calls(), cfg.http.body_timeout_s,
                                 sampling_defaults=rt.sampling_defaults)
        self.generation = GenerationService(rt.async_router, rt.tokenizer, cfg.model_name, api_key=rt.api_key,
                                            metrics=self.http.metrics, default_max_tokens=cfg.http.default_max_tokens,
                                            speculative_method=cfg.speculative_method or "", max_calls=self._max_calls(),
                                            sampling_defaults=rt.sampling_defaults)
        self.grpc_server = self._start_grpc() if cfg.grpc.enabled and cfg.grpc.server == "replica" else None
        self.http_server = self._start_http() if cfg.http.server == "replica" else None
        freeze_startup_heap()

    def _start_http(self):
        """specray's own HTTP server in this replica (http.server 'replica'), on its own thread."""
        from specray.cluster.serve.http_server import BackgroundServer

        h = self.config.http
        return BackgroundServer(self.http.app, h.host, h.port, h.keep_alive_timeout_s, h.header_timeout_s).__enter__()

    def _start_grpc(self):
        """specray's own gRPC server in this replica (grpc.server 'replica'), on its own thread."""
        import grpc

        from specray.cluster.serve.grpc_server import GrpcLimits, GrpcServerThread

        g = self.config.grpc
        pair = g.tls_pair()
        credentials = grpc.ssl_server_credentials([pair]) if pair else None
        limits = GrpcLimits(g.max_message_bytes, g.max_concurrent_streams, g.keepalive_time_s, g.keepalive_timeout_s,
                            g.idle_timeout_s)
        return GrpcServerThread(self.generation, g.host or self.config.http.host, g.port, credentials,
                                limits).__enter__()  # the service bounds its calls

    def _max_calls(self) -> int:
        """Calls each API takes at once (as Serve's proxy would queue): what the router may run and
        queue, and some; more are refused at once with 503 / UNAVAILABLE (health checks, metrics and
        gRPC's model list never are)."""
        r = self.config.router
        return r.max_num_seqs + 2 * r.max_waiting + 16

    def __serve_build_asgi_app__(self):
        return self.http.app

    # -- gRPC through Serve's gRPC ingress: method names are the rpc names -------------------
    async def Generate(self, request, grpc_context=None):
        async for msg in serve_stream(self.generation.generate, request, grpc_context):
            yield msg

    async def Complete(self, request, grpc_context=None):
        return await serve_unary(self.generation.complete, request, grpc_context)

    async def ListModels(self, request, grpc_context=None):
        return await serve_unary(self.generation.list_models, request, grpc_context)

    async def Check(self, request, grpc_context=None):  # grpc.health.v1.Health
        return await serve_unary(self.generation.check_health, request, grpc_context)

    def placement(self) -> dict:
        """Where the pools' workers run: names (for `ray.get_actor`), namespace and node ids."""
        from specray.cluster.pools.builder import namespace

        rt = self.runtime
        if not hasattr(rt.target_pool, "worker_names"):  # colocated: the workers run in this replica
            import ray

            return {"namespace": namespace(), "colocated": ray.get_runtime_context().get_node_id()}
        out = {"namespace": namespace(), "target": list(zip(rt.target_pool.worker_names(), rt.target_pool.node_ids()))}
        if rt.draft_pool is not None and hasattr(rt.draft_pool, "node_id"):
            try:
                node = rt.draft_pool.node_id()
            except Exception:  # noqa: BLE001 - restarting: its node is not known right now
                node = None
            out["draft"] = list(zip(rt.draft_pool.worker_names(), [node]))
        return out

    def round_stats(self) -> dict:
        """The router's round counters and its pools' compute (cluster/router/round_stats.py)."""
        from specray.cluster.router.round_stats import snapshot

        return snapshot(self.runtime.router)

    def check_health(self) -> None:
        """Serve's health probe: the router must still be taking turns."""
        if not self.runtime.async_router.alive:
            raise RuntimeError("the router stopped")

    def __del__(self):
        for server in (getattr(self, "grpc_server", None), getattr(self, "http_server", None)):
            if server is not None:
                server.__exit__(None, None, None)
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.shutdown()


def build_app(args: dict[str, Any] | None = None):
    """Serve application builder (RayService serveConfigV2 `import_path`)."""
    from specray.cluster.pools.builder import serve_deployment

    raw = dict((args or {}).get("config") or {})
    cfg = resolve_colocation(ServeConfig.from_dict(raw))  # fail fast, before any replica starts
    return serve_deployment(SpecrayServer, cfg).bind(cfg.model_dump())
