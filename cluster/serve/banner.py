"""What `specray serve` prints once it serves: its endpoints and a request to paste."""

from __future__ import annotations

import shlex


def key_hint(http) -> str:
    """The key as the banner's example spells it: where it came from, never its value."""
    if http.api_key:
        return "<the --api-key value>"
    if http.api_key_file:
        return f"$(cat {shlex.quote(http.api_key_file)})"
    return f"${http.api_key_env}"


def _bracketed(host: str) -> str:
    """An IPv6 address as a URL or a gRPC target writes it."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def endpoint_banner(cfg, handle) -> str:
    everywhere = cfg.http.host in ("0.0.0.0", "::", "[::]")
    host = "127.0.0.1" if everywhere else cfg.http.host
    host = _bracketed(host)
    url = f"http://{host}:{cfg.http.port}"
    auth = f' -H "Authorization: Bearer {key_hint(cfg.http)}"' if handle.get("api_key") else ""
    lines = [
        f"specray is serving {cfg.model_name!r} "
        f"(speculation: {cfg.speculative_method or 'off'}, "
        + ("" if cfg.diffusion else f"transport: {cfg.draft_transport}, ") +  # no draft pool to reach
        f"workers: {'in the replica' if handle.get('colocated') else 'Ray actor pools'})",
        f"  HTTP (OpenAI-compatible): {url}/v1   health: {url}/health   metrics: {url}/metrics",
    ]
    if handle.get("grpc"):
        tls = ", TLS" if cfg.grpc.tls_cert_file else ""
        lines.append(f"  gRPC (specray.v1.Generation{tls}): {_bracketed(cfg.grpc.host) if cfg.grpc.host else host}:"
                     f"{cfg.grpc.port}")
    if everywhere:
        lines.append(f"  listening on every interface ({cfg.http.host}): reachable from other machines")
    lines += ["  try:",
              f"    curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\",
              f"      -d '{{\"model\": \"{cfg.model_name}\", \"messages\": [{{\"role\": \"user\", "
              f"\"content\": \"What is speculative decoding?\"}}], \"max_tokens\": 64}}'",
              "  Ctrl-C (or SIGTERM) stops the server."]
    return "\n".join(lines)
