"""The Ray Serve application: one deployment that owns the router and serves the OpenAI HTTP API
(and the gRPC API through Serve's gRPC ingress) over it.

The router is stateful (running sequences, in-flight groups), so the deployment runs one replica;
the pools it drives scale separately. `build_app` is the import path a RayService's serveConfigV2
points at: `specray.cluster.serve_app:build_app` with args `{"config": {...ServeConfig...}}`.
"""

from __future__ import annotations

from typing import Any

from specray.cluster.openai_api import OpenAIServer
from specray.cluster.runtime import build_runtime
from specray.cluster.serve_config import ServeConfig


class SpecrayServer:
    """A plain class; cluster/builder.py turns it into the Serve deployment."""

    def __init__(self, config: dict[str, Any]):
        self.config = ServeConfig.from_dict(config)
        self.runtime = build_runtime(self.config)
        rt = self.runtime
        self.http = OpenAIServer(rt.async_engine, rt.tokenizer, self.config.model_name, rt.api_key,
                                 self.config.http.default_max_tokens)

    def __serve_build_asgi_app__(self):
        return self.http.app

    def placement(self) -> dict:
        """Where the pools' workers run: names (for `ray.get_actor`), namespace and node ids."""
        from specray.cluster.builder import namespace

        rt = self.runtime
        out = {"namespace": namespace(), "target": list(zip(rt.target_pool.worker_names(), rt.target_pool.node_ids()))}
        if rt.draft_pool is not None and hasattr(rt.draft_pool, "node_id"):
            out["draft"] = list(zip(rt.draft_pool.worker_names(), [rt.draft_pool.node_id()]))
        return out

    def check_health(self) -> None:
        """Serve's health probe: the engine thread must be alive."""
        if not self.runtime.async_engine.alive:
            raise RuntimeError("the engine thread stopped")

    def __del__(self):
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.shutdown()


def build_app(args: dict[str, Any] | None = None):
    """Serve application builder (RayService serveConfigV2 `import_path`)."""
    from specray.cluster.builder import serve_deployment

    raw = dict((args or {}).get("config") or {})
    cfg = ServeConfig.from_dict(raw)  # fail fast, before any replica starts
    return serve_deployment(SpecrayServer, cfg).bind(cfg.model_dump())
